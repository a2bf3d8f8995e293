// Checks RowanKV client histories (the JSON lines `rowankv sim --history FILE`
// writes) for linearizability with Porcupine, independently of the simulator's
// own checker.
//
//	go run . [--timeout 30s] HISTORY...
//
// Each history is checked per key (a key-value store is linearizable if every
// key is). Operations of status `fail` certainly had no effect and are left
// out; a `get` of status `unknown` observed nothing and is left out; a `put` or
// `del` of status `unknown` may take effect at any time after its call or
// never, so it returns at the end of time (and one that no read can have
// observed is left out: see dropUnobservedUnknownWrites). Exit status: 0 if every history is
// linearizable, 1 if one is not, 2 on bad input or a check that ran out of time.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

// One line of a history.
type record struct {
	Client int     `json:"client"`
	Op     string  `json:"op"`
	Key    string  `json:"key"`
	Value  *string `json:"value"`
	Output *string `json:"output"`
	Call   int64   `json:"call"`
	Return int64   `json:"return"`
	Status string  `json:"status"`
}

type input struct {
	op    string // put, get, del
	key   string
	value string // put
}

// What a get returned; writes return nothing anyone checks.
type output struct {
	present bool
	value   string
}

// The value of one key: absent, or a string.
type state struct {
	present bool
	value   string
}

var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			k := op.Input.(input).key
			if _, seen := byKey[k]; !seen {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		parts := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			parts = append(parts, byKey[k])
		}
		return parts
	},
	Init: func() interface{} { return state{} },
	Step: func(s, in, out interface{}) (bool, interface{}) {
		st := s.(state)
		i := in.(input)
		switch i.op {
		case "put":
			return true, state{present: true, value: i.value}
		case "del":
			return true, state{}
		default:
			o := out.(output)
			return o == output(st), st
		}
	},
	Equal: func(a, b interface{}) bool { return a.(state) == b.(state) },
	DescribeOperation: func(in, out interface{}) string {
		i := in.(input)
		switch i.op {
		case "put":
			return fmt.Sprintf("put(%s, %q)", i.key, i.value)
		case "del":
			return fmt.Sprintf("del(%s)", i.key)
		default:
			o := out.(output)
			if !o.present {
				return fmt.Sprintf("get(%s) -> absent", i.key)
			}
			return fmt.Sprintf("get(%s) -> %q", i.key, o.value)
		}
	},
}

// Leaves out the writes of unknown outcome that no read can have observed, and
// returns the operations kept and how many were left out:
//   - a `put` whose value no read returned, on a key whose every put wrote a
//     distinct value;
//   - a `del` after whose call no read of its key returned "absent".
//
// Such a write never decides whether a history is linearizable. In any
// linearization, the reads between it and the next write of its key would
// return its value, or "absent" after a del. Those reads are linearized after
// the write, so they return after its call, and there are none. Taking the write
// out changes what no read returned. But each unknown write left in returns at
// the end of time, and can double the orders the search may have to try.
func dropUnobservedUnknownWrites(ops []porcupine.Operation) ([]porcupine.Operation, int) {
	type kv struct{ key, value string }
	puts := map[kv]int{}
	read := map[kv]bool{}
	// The latest return of a read that found each key absent.
	lastAbsent := map[string]int64{}
	for _, op := range ops {
		in := op.Input.(input)
		switch in.op {
		case "put":
			puts[kv{in.key, in.value}]++
		case "get":
			if o := op.Output.(output); o.present {
				read[kv{in.key, o.value}] = true
			} else if at, ok := lastAbsent[in.key]; !ok || op.Return > at {
				lastAbsent[in.key] = op.Return
			}
		}
	}
	distinct := map[string]bool{}
	for p := range puts {
		distinct[p.key] = true
	}
	for p, n := range puts {
		if n > 1 {
			distinct[p.key] = false
		}
	}
	kept := ops[:0]
	dropped := 0
	for _, op := range ops {
		in := op.Input.(input)
		unobserved := false
		if op.Return == math.MaxInt64 {
			switch in.op {
			case "put":
				unobserved = distinct[in.key] && !read[kv{in.key, in.value}]
			case "del":
				at, ok := lastAbsent[in.key]
				unobserved = !ok || at < op.Call
			}
		}
		if unobserved {
			dropped++
			continue
		}
		kept = append(kept, op)
	}
	return kept, dropped
}

// The operations of one history file, and how many were left out.
func load(path string) ([]porcupine.Operation, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	return parse(f, path)
}

// The operations of a history read from r (`name` for errors), and how many
// were left out.
func parse(r io.Reader, name string) ([]porcupine.Operation, int, error) {
	var ops []porcupine.Operation
	left := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for line := 1; sc.Scan(); line++ {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, 0, fmt.Errorf("%s:%d: %v", name, line, err)
		}
		op, keep, err := operation(r)
		if err != nil {
			return nil, 0, fmt.Errorf("%s:%d: %v", name, line, err)
		}
		if !keep {
			left++
			continue
		}
		ops = append(ops, op)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	ops, dropped := dropUnobservedUnknownWrites(ops)
	return ops, left + dropped, nil
}

// One record as an operation, and whether it is checked at all.
func operation(r record) (porcupine.Operation, bool, error) {
	var none porcupine.Operation
	if r.Return < r.Call {
		return none, false, fmt.Errorf("returns (%d) before its call (%d)", r.Return, r.Call)
	}
	in := input{op: r.Op, key: r.Key}
	var out output
	switch r.Op {
	case "put":
		if r.Value == nil {
			return none, false, fmt.Errorf("a put without a value")
		}
		in.value = *r.Value
	case "del":
	case "get":
		if r.Output != nil {
			out = output{present: true, value: *r.Output}
		}
	default:
		return none, false, fmt.Errorf("unknown op %q", r.Op)
	}
	ret := r.Return
	switch r.Status {
	case "ok":
	case "fail":
		return none, false, nil
	case "unknown":
		if r.Op == "get" {
			return none, false, nil
		}
		ret = math.MaxInt64
	default:
		return none, false, fmt.Errorf("unknown status %q", r.Status)
	}
	return porcupine.Operation{
		ClientId: r.Client,
		Input:    in,
		Call:     r.Call,
		Output:   out,
		Return:   ret,
	}, true, nil
}

func main() {
	timeout := flag.Duration("timeout", 30*time.Second, "time limit per history (0: none)")
	visualize := flag.String("visualize", "", "write an HTML visualization of the first history that is not linearizable here")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: porcupine-check [--timeout D] [--visualize FILE] HISTORY...")
		os.Exit(2)
	}
	var checked, ops, left, illegal, unknown int
	start := time.Now()
	for _, path := range flag.Args() {
		history, l, err := load(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		res, info := porcupine.CheckOperationsVerbose(model, history, *timeout)
		checked++
		ops += len(history)
		left += l
		switch res {
		case porcupine.Ok:
		case porcupine.Illegal:
			illegal++
			fmt.Printf("%s: NOT linearizable (%d operations)\n", path, len(history))
			if *visualize != "" && illegal == 1 {
				if err := porcupine.VisualizePath(model, info, *visualize); err != nil {
					fmt.Fprintln(os.Stderr, err)
				} else {
					fmt.Printf("visualization: %s\n", *visualize)
				}
			}
		default:
			unknown++
			fmt.Printf("%s: undecided within %v (%d operations)\n", path, *timeout, len(history))
		}
	}
	fmt.Printf("porcupine: histories %d, operations checked %d (left out: %d failed, unanswered reads, unobserved unknown writes), not linearizable %d, undecided %d, %.2f s\n",
		checked, ops, left, illegal, unknown, time.Since(start).Seconds())
	switch {
	case illegal > 0:
		os.Exit(1)
	case unknown > 0:
		os.Exit(2)
	}
}
