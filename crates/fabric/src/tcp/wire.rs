//! The tcp fabric's wire format: the authenticating handshake and the request and
//! response frames. Documented in `docs/format/tcp-fabric.md`; this module is its
//! single owner.
//!
//! Everything is little-endian. Every field a decoder reads is checked: lengths
//! against the caps below, reserved bytes and unused flags against zero, opcodes
//! and status codes against the known ones, request ids against the sequence.
//! A violation is a [`WireError`]: the connection it came on is closed, nothing is
//! executed. The module is public so that tools and tests can speak the protocol
//! (the hostile-input tests craft frames with it).

use std::io::{self, Read, Write};

use hmac::{Hmac, Mac};
use rowankv_types::{NodeId, QpNum};
use sha2::Sha256;

use crate::verbs::{QpAddr, WcStatus};

/// First bytes of the challenge and of the hello.
pub const MAGIC: [u8; 8] = *b"RKVTCPF1";
/// Protocol version carried by the handshake.
pub const VERSION: u16 = 2;
/// Largest payload of one frame: a SEND's or WRITE's data, a READ's length.
pub const MAX_PAYLOAD: usize = 16 << 20;
/// Bytes of a request frame after its length field, payload excluded.
pub const REQUEST_HEADER_BYTES: usize = 44;
/// Bytes of a response frame after its length field, payload excluded.
pub const RESPONSE_HEADER_BYTES: usize = 20;
/// Size of the target's challenge.
pub const CHALLENGE_BYTES: usize = 32;
/// Size of the initiator's hello.
pub const HELLO_BYTES: usize = 88;
/// Size of the target's welcome.
pub const WELCOME_BYTES: usize = 40;
/// Size of a nonce.
pub const NONCE_BYTES: usize = 16;

const HELLO_LABEL: &[u8] = b"rowankv-tcp-fabric/1 hello";
const WELCOME_LABEL: &[u8] = b"rowankv-tcp-fabric/1 welcome";

const FLAG_IMM: u8 = 1;
const FLAG_PERSIST: u8 = 2;

type HmacSha256 = Hmac<Sha256>;

/// What a malformed or hostile peer did wrong.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("frame length {0} is shorter than its header")]
    FrameTooShort(u32),
    #[error("frame length {0} exceeds the cap")]
    FrameTooLarge(u32),
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    #[error("flags {flags:#04x} not allowed for {opcode:?}")]
    BadFlags { opcode: Opcode, flags: u8 },
    #[error("reserved or unused field is not zero")]
    NonZeroReserved,
    #[error("{0:?} carries no payload")]
    UnexpectedPayload(Opcode),
    #[error("READ of {0} bytes exceeds the cap")]
    ReadTooLong(u64),
    #[error("request id {got}, expected {expected}")]
    OutOfSequence { expected: u64, got: u64 },
    #[error("unknown status {0}")]
    UnknownStatus(u8),
    #[error("response payload of {got} bytes, expected {expected}")]
    BadResponseLength { expected: usize, got: usize },
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported protocol version {0}")]
    Version(u16),
}

/// The operation of a request frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    Send = 1,
    Write = 2,
    Read = 3,
    CompareSwap = 4,
    FetchAdd = 5,
    /// IBTA 1.5 FLUSH: `arg0` the length, `arg1` the placement
    /// ([`PLACEMENT_GLOBAL`] or [`PLACEMENT_PERSISTENT`]). Since version 2.
    Flush = 6,
    /// IBTA 1.5 ATOMIC WRITE: `arg0` the 8 bytes (little-endian); may carry the
    /// persist flag. Since version 2.
    AtomicWrite = 7,
}

/// A FLUSH's `arg1`: the global-visibility placement.
pub const PLACEMENT_GLOBAL: u64 = 1;
/// A FLUSH's `arg1`: the persistence placement.
pub const PLACEMENT_PERSISTENT: u64 = 2;

impl Opcode {
    fn from_u8(b: u8) -> Result<Opcode, WireError> {
        Ok(match b {
            1 => Opcode::Send,
            2 => Opcode::Write,
            3 => Opcode::Read,
            4 => Opcode::CompareSwap,
            5 => Opcode::FetchAdd,
            6 => Opcode::Flush,
            7 => Opcode::AtomicWrite,
            _ => return Err(WireError::UnknownOpcode(b)),
        })
    }
}

/// The fixed part of a request frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub opcode: Opcode,
    pub imm: Option<u32>,
    pub persist: bool,
    pub req_id: u64,
    pub rkey: u32,
    pub offset: u64,
    /// READ and FLUSH: length; COMPARE_SWAP: expected value; FETCH_ADD: addend;
    /// ATOMIC_WRITE: the value.
    pub arg0: u64,
    /// COMPARE_SWAP: the value swapped in; FLUSH: the placement.
    pub arg1: u64,
}

impl RequestHeader {
    pub fn new(opcode: Opcode, req_id: u64) -> Self {
        RequestHeader {
            opcode,
            imm: None,
            persist: false,
            req_id,
            rkey: 0,
            offset: 0,
            arg0: 0,
            arg1: 0,
        }
    }
}

/// Append a request frame to `out`. Panics if `payload` exceeds [`MAX_PAYLOAD`]
/// (the caller checks at post time).
pub fn encode_request(out: &mut Vec<u8>, h: &RequestHeader, payload: &[u8]) {
    assert!(payload.len() <= MAX_PAYLOAD, "payload over the frame cap");
    let mut flags = 0u8;
    if h.imm.is_some() {
        flags |= FLAG_IMM;
    }
    if h.persist {
        flags |= FLAG_PERSIST;
    }
    let len = (REQUEST_HEADER_BYTES + payload.len()) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.push(h.opcode as u8);
    out.push(flags);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&h.req_id.to_le_bytes());
    out.extend_from_slice(&h.imm.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&h.rkey.to_le_bytes());
    out.extend_from_slice(&h.offset.to_le_bytes());
    out.extend_from_slice(&h.arg0.to_le_bytes());
    out.extend_from_slice(&h.arg1.to_le_bytes());
    out.extend_from_slice(payload);
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Read one frame's length field and check it against `header` and the cap;
/// returns the payload length.
fn read_frame_len(r: &mut impl Read, header: usize) -> Result<usize, WireError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if (len as usize) < header {
        return Err(WireError::FrameTooShort(len));
    }
    if len as usize - header > MAX_PAYLOAD {
        return Err(WireError::FrameTooLarge(len));
    }
    Ok(len as usize - header)
}

/// Read and validate one request frame; its payload goes to `payload` (resized).
/// `expected_req_id` is the id the sequence requires.
pub fn read_request(
    r: &mut impl Read,
    expected_req_id: u64,
    payload: &mut Vec<u8>,
) -> Result<RequestHeader, WireError> {
    let payload_len = read_frame_len(r, REQUEST_HEADER_BYTES)?;
    let mut b = [0u8; REQUEST_HEADER_BYTES];
    r.read_exact(&mut b)?;
    let opcode = Opcode::from_u8(b[0])?;
    let flags = b[1];
    let allowed = match opcode {
        Opcode::Send | Opcode::Write => FLAG_IMM | FLAG_PERSIST,
        Opcode::AtomicWrite => FLAG_PERSIST,
        Opcode::Read | Opcode::CompareSwap | Opcode::FetchAdd | Opcode::Flush => 0,
    };
    if flags & !allowed != 0 {
        return Err(WireError::BadFlags { opcode, flags });
    }
    if u16_at(&b, 2) != 0 {
        return Err(WireError::NonZeroReserved);
    }
    let h = RequestHeader {
        opcode,
        imm: (flags & FLAG_IMM != 0).then(|| u32_at(&b, 12)),
        persist: flags & FLAG_PERSIST != 0,
        req_id: u64_at(&b, 4),
        rkey: u32_at(&b, 16),
        offset: u64_at(&b, 20),
        arg0: u64_at(&b, 28),
        arg1: u64_at(&b, 36),
    };
    if h.req_id != expected_req_id {
        return Err(WireError::OutOfSequence {
            expected: expected_req_id,
            got: h.req_id,
        });
    }
    // Fields an opcode does not use must be zero: one meaning per frame.
    let unused_zero = match opcode {
        Opcode::Send => h.rkey == 0 && h.offset == 0 && h.arg0 == 0 && h.arg1 == 0,
        Opcode::Write => h.arg0 == 0 && h.arg1 == 0,
        Opcode::Read | Opcode::FetchAdd | Opcode::AtomicWrite => h.arg1 == 0,
        Opcode::Flush => h.arg1 == PLACEMENT_GLOBAL || h.arg1 == PLACEMENT_PERSISTENT,
        Opcode::CompareSwap => true,
    } && (h.imm.is_some() || u32_at(&b, 12) == 0);
    if !unused_zero {
        return Err(WireError::NonZeroReserved);
    }
    match opcode {
        Opcode::Read
        | Opcode::CompareSwap
        | Opcode::FetchAdd
        | Opcode::Flush
        | Opcode::AtomicWrite
            if payload_len != 0 =>
        {
            return Err(WireError::UnexpectedPayload(opcode));
        }
        Opcode::Read if h.arg0 > MAX_PAYLOAD as u64 => {
            return Err(WireError::ReadTooLong(h.arg0));
        }
        _ => {}
    }
    payload.clear();
    payload.resize(payload_len, 0);
    r.read_exact(payload)?;
    Ok(h)
}

/// Status of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Success = 0,
    /// Wrong key, out of bounds, missing right, misaligned atomic.
    RemoteAccessError = 1,
    /// The message is larger than the receive buffer at the head of the SRQ.
    RemoteInvalidRequest = 2,
    /// No receive buffer posted.
    RnrRetryExceeded = 3,
    /// The target queue pair is not connected to the initiator (closed, in the
    /// error state, crashed node, cut link).
    NotConnected = 4,
    /// Not executed: an earlier request of this connection failed.
    Flushed = 5,
}

impl Status {
    pub fn from_u8(b: u8) -> Result<Status, WireError> {
        Ok(match b {
            0 => Status::Success,
            1 => Status::RemoteAccessError,
            2 => Status::RemoteInvalidRequest,
            3 => Status::RnrRetryExceeded,
            4 => Status::NotConnected,
            5 => Status::Flushed,
            _ => return Err(WireError::UnknownStatus(b)),
        })
    }

    /// The completion status an initiator reports for this response.
    pub fn to_wc(self) -> WcStatus {
        match self {
            Status::Success => WcStatus::Success,
            Status::RemoteAccessError => WcStatus::RemoteAccessError,
            Status::RemoteInvalidRequest => WcStatus::RemoteInvalidRequest,
            Status::RnrRetryExceeded => WcStatus::RnrRetryExceeded,
            Status::NotConnected => WcStatus::RetryExceeded,
            Status::Flushed => WcStatus::WrFlushError,
        }
    }
}

/// The fixed part of a response frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    pub status: Status,
    pub req_id: u64,
    /// COMPARE_SWAP and FETCH_ADD: the old value.
    pub value: u64,
}

/// Append a response frame to `out`.
pub fn encode_response(out: &mut Vec<u8>, h: &ResponseHeader, payload: &[u8]) {
    encode_response_header(out, h, payload.len());
    out.extend_from_slice(payload);
}

/// Append the length field and header of a response frame whose `payload_len`
/// payload bytes the caller writes next.
pub fn encode_response_header(out: &mut Vec<u8>, h: &ResponseHeader, payload_len: usize) {
    assert!(payload_len <= MAX_PAYLOAD, "payload over the frame cap");
    let len = (RESPONSE_HEADER_BYTES + payload_len) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.push(h.status as u8);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&h.req_id.to_le_bytes());
    out.extend_from_slice(&h.value.to_le_bytes());
}

/// Read and validate one response frame; its payload goes to `payload`.
pub fn read_response(
    r: &mut impl Read,
    payload: &mut Vec<u8>,
) -> Result<ResponseHeader, WireError> {
    let payload_len = read_frame_len(r, RESPONSE_HEADER_BYTES)?;
    let mut b = [0u8; RESPONSE_HEADER_BYTES];
    r.read_exact(&mut b)?;
    let status = Status::from_u8(b[0])?;
    if b[1..4] != [0, 0, 0] {
        return Err(WireError::NonZeroReserved);
    }
    let h = ResponseHeader {
        status,
        req_id: u64_at(&b, 4),
        value: u64_at(&b, 12),
    };
    payload.clear();
    payload.resize(payload_len, 0);
    r.read_exact(payload)?;
    Ok(h)
}

// ---------------------------------------------------------------------------
// Handshake

/// What both ends of a connection must share: the cluster id and the secret from
/// the configuration.
#[derive(Clone)]
pub struct Credentials {
    pub cluster_id: u64,
    secret: std::sync::Arc<[u8]>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("cluster_id", &self.cluster_id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Credentials for `cluster_id` with `secret`; `None` for an empty secret.
    pub fn new(cluster_id: u64, secret: &[u8]) -> Option<Self> {
        (!secret.is_empty()).then(|| Credentials {
            cluster_id,
            secret: secret.into(),
        })
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.secret).expect("HMAC takes keys of any length")
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("authentication failed (wrong secret)")]
    BadMac,
    #[error("cluster id {got:#x} is not this cluster's")]
    WrongCluster { got: u64 },
    #[error("connection meant for {meant}, reached {reached}")]
    WrongNode { meant: NodeId, reached: NodeId },
    #[error("refused by the target: {0:?}")]
    Refused(Welcome),
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Wire(WireError::Io(e))
    }
}

/// The target's challenge, sent first on every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub node: NodeId,
    pub nonce: [u8; NONCE_BYTES],
}

impl Challenge {
    pub fn encode(&self) -> [u8; CHALLENGE_BYTES] {
        let mut b = [0u8; CHALLENGE_BYTES];
        b[..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.node.0.to_le_bytes());
        b[16..32].copy_from_slice(&self.nonce);
        b
    }

    pub fn decode(b: &[u8; CHALLENGE_BYTES]) -> Result<Challenge, WireError> {
        check_magic_version(b)?;
        if u16_at(b, 10) != 0 {
            return Err(WireError::NonZeroReserved);
        }
        Ok(Challenge {
            node: NodeId(u32_at(b, 12)),
            nonce: b[16..32].try_into().expect("16 bytes"),
        })
    }
}

fn check_magic_version(b: &[u8]) -> Result<(), WireError> {
    if b[..8] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let v = u16_at(b, 8);
    if v != VERSION {
        return Err(WireError::Version(v));
    }
    Ok(())
}

/// The initiator's hello: who it is, which queue pair it binds to, and its proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub src: QpAddr,
    pub dst: QpAddr,
    pub cluster_id: u64,
    pub nonce: [u8; NONCE_BYTES],
}

impl Hello {
    /// Encode and sign, answering `challenge`.
    pub fn encode(&self, cred: &Credentials, challenge: &Challenge) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.src.node.0.to_le_bytes());
        b[16..20].copy_from_slice(&self.src.qpn.0.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst.node.0.to_le_bytes());
        b[24..28].copy_from_slice(&self.dst.qpn.0.to_le_bytes());
        b[32..40].copy_from_slice(&self.cluster_id.to_le_bytes());
        b[40..56].copy_from_slice(&self.nonce);
        let tag = hello_mac(cred, &challenge.nonce, &b[..56]);
        b[56..88].copy_from_slice(&tag);
        b
    }

    /// Decode a hello and check it against the target's credentials, node and
    /// challenge nonce. The MAC is compared in constant time.
    pub fn verify(
        b: &[u8; HELLO_BYTES],
        cred: &Credentials,
        challenge: &Challenge,
    ) -> Result<Hello, HandshakeError> {
        check_magic_version(b)?;
        if u16_at(b, 10) != 0 || u32_at(b, 28) != 0 {
            return Err(WireError::NonZeroReserved.into());
        }
        let mut mac = cred.mac();
        mac.update(HELLO_LABEL);
        mac.update(&challenge.nonce);
        mac.update(&b[..56]);
        mac.verify_slice(&b[56..88])
            .map_err(|_| HandshakeError::BadMac)?;
        let hello = Hello {
            src: QpAddr {
                node: NodeId(u32_at(b, 12)),
                qpn: QpNum(u32_at(b, 16)),
            },
            dst: QpAddr {
                node: NodeId(u32_at(b, 20)),
                qpn: QpNum(u32_at(b, 24)),
            },
            cluster_id: u64_at(b, 32),
            nonce: b[40..56].try_into().expect("16 bytes"),
        };
        if hello.cluster_id != cred.cluster_id {
            return Err(HandshakeError::WrongCluster {
                got: hello.cluster_id,
            });
        }
        if hello.dst.node != challenge.node {
            return Err(HandshakeError::WrongNode {
                meant: hello.dst.node,
                reached: challenge.node,
            });
        }
        Ok(hello)
    }
}

fn hello_mac(cred: &Credentials, server_nonce: &[u8], hello: &[u8]) -> [u8; 32] {
    let mut mac = cred.mac();
    mac.update(HELLO_LABEL);
    mac.update(server_nonce);
    mac.update(hello);
    mac.finalize().into_bytes().into()
}

fn welcome_mac(cred: &Credentials, hello: &Hello, challenge: &Challenge, status: u8) -> [u8; 32] {
    let mut mac = cred.mac();
    mac.update(WELCOME_LABEL);
    mac.update(&hello.nonce);
    mac.update(&challenge.nonce);
    mac.update(&[status]);
    mac.finalize().into_bytes().into()
}

/// The target's answer to a hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Welcome {
    /// Authenticated and bound to the queue pair.
    Accepted = 0,
    /// The hello did not prove the secret and cluster id (or was malformed).
    Refused = 1,
    /// Authenticated, but the queue pair does not exist or will not take this
    /// initiator (closed, connected to another queue pair).
    NoSuchQp = 2,
}

impl Welcome {
    /// Encode; an accepted or no-such-QP answer carries the target's own proof, a
    /// refusal carries zeros (the peer proved nothing to answer).
    pub fn encode(
        self,
        cred: &Credentials,
        hello: Option<&Hello>,
        challenge: &Challenge,
    ) -> [u8; WELCOME_BYTES] {
        let mut b = [0u8; WELCOME_BYTES];
        b[0] = self as u8;
        if let Some(h) = hello {
            let tag = welcome_mac(cred, h, challenge, self as u8);
            b[8..40].copy_from_slice(&tag);
        }
        b
    }

    /// Decode and, unless refused, check the target's proof.
    pub fn verify(
        b: &[u8; WELCOME_BYTES],
        cred: &Credentials,
        hello: &Hello,
        challenge: &Challenge,
    ) -> Result<Welcome, HandshakeError> {
        if b[1..8] != [0; 7] {
            return Err(WireError::NonZeroReserved.into());
        }
        let w = match b[0] {
            0 => Welcome::Accepted,
            1 => return Ok(Welcome::Refused),
            2 => Welcome::NoSuchQp,
            s => return Err(WireError::UnknownStatus(s).into()),
        };
        let mut mac = cred.mac();
        mac.update(WELCOME_LABEL);
        mac.update(&hello.nonce);
        mac.update(&challenge.nonce);
        mac.update(&[b[0]]);
        mac.verify_slice(&b[8..40])
            .map_err(|_| HandshakeError::BadMac)?;
        Ok(w)
    }
}

/// The initiator's side of the handshake on a fresh connection: read the
/// challenge, send the hello binding `src` to `dst`, check the welcome.
pub fn client_handshake<S: Read + Write>(
    stream: &mut S,
    cred: &Credentials,
    src: QpAddr,
    dst: QpAddr,
) -> Result<(), HandshakeError> {
    let mut c = [0u8; CHALLENGE_BYTES];
    stream.read_exact(&mut c)?;
    let challenge = Challenge::decode(&c)?;
    if challenge.node != dst.node {
        return Err(HandshakeError::WrongNode {
            meant: dst.node,
            reached: challenge.node,
        });
    }
    let hello = Hello {
        src,
        dst,
        cluster_id: cred.cluster_id,
        nonce: rand::random(),
    };
    stream.write_all(&hello.encode(cred, &challenge))?;
    stream.flush()?;
    let mut w = [0u8; WELCOME_BYTES];
    stream.read_exact(&mut w)?;
    match Welcome::verify(&w, cred, &hello, &challenge)? {
        Welcome::Accepted => Ok(()),
        other => Err(HandshakeError::Refused(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(secret: &[u8]) -> Credentials {
        Credentials::new(7, secret).unwrap()
    }

    #[test]
    fn request_round_trip_and_checks() {
        let mut h = RequestHeader::new(Opcode::Write, 3);
        h.imm = Some(9);
        h.persist = true;
        h.rkey = 0xABCD;
        h.offset = 77;
        let mut buf = Vec::new();
        encode_request(&mut buf, &h, b"hello");
        let mut payload = Vec::new();
        let got = read_request(&mut &buf[..], 3, &mut payload).unwrap();
        assert_eq!(got, h);
        assert_eq!(payload, b"hello");
        assert!(matches!(
            read_request(&mut &buf[..], 4, &mut payload),
            Err(WireError::OutOfSequence { .. })
        ));
        // Unknown opcode.
        let mut bad = buf.clone();
        bad[4] = 9;
        assert!(matches!(
            read_request(&mut &bad[..], 3, &mut payload),
            Err(WireError::UnknownOpcode(9))
        ));
        // A READ with a payload.
        let mut bad = buf.clone();
        bad[4] = Opcode::Read as u8;
        bad[5] = 0;
        assert!(read_request(&mut &bad[..], 3, &mut payload).is_err());
        // Oversized and undersized length fields.
        let mut bad = buf.clone();
        bad[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_request(&mut &bad[..], 3, &mut payload),
            Err(WireError::FrameTooLarge(_))
        ));
        bad[..4].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            read_request(&mut &bad[..], 3, &mut payload),
            Err(WireError::FrameTooShort(3))
        ));
        // Truncated.
        assert!(read_request(&mut &buf[..buf.len() - 1], 3, &mut payload).is_err());
    }

    #[test]
    fn flush_and_atomic_write_frames_round_trip_and_are_checked() {
        let mut payload = Vec::new();
        let mut flush = RequestHeader::new(Opcode::Flush, 0);
        flush.rkey = 5;
        flush.offset = 64;
        flush.arg0 = 4096;
        flush.arg1 = PLACEMENT_PERSISTENT;
        let mut buf = Vec::new();
        encode_request(&mut buf, &flush, &[]);
        assert_eq!(read_request(&mut &buf[..], 0, &mut payload).unwrap(), flush);
        // A placement that is neither 1 nor 2 is refused.
        for placement in [0u64, 3, u64::MAX] {
            let mut bad = buf.clone();
            bad[40..48].copy_from_slice(&placement.to_le_bytes());
            assert!(
                matches!(
                    read_request(&mut &bad[..], 0, &mut payload),
                    Err(WireError::NonZeroReserved)
                ),
                "placement {placement}"
            );
        }
        // No flags on a FLUSH, no payload.
        let mut bad = buf.clone();
        bad[5] = 2;
        assert!(matches!(
            read_request(&mut &bad[..], 0, &mut payload),
            Err(WireError::BadFlags { .. })
        ));
        let mut with_payload = Vec::new();
        let mut h = flush;
        h.arg1 = PLACEMENT_GLOBAL;
        encode_request(&mut with_payload, &h, b"x");
        assert!(matches!(
            read_request(&mut &with_payload[..], 0, &mut payload),
            Err(WireError::UnexpectedPayload(Opcode::Flush))
        ));

        let mut aw = RequestHeader::new(Opcode::AtomicWrite, 1);
        aw.persist = true;
        aw.rkey = 5;
        aw.offset = 8;
        aw.arg0 = u64::MAX;
        let mut buf = Vec::new();
        encode_request(&mut buf, &aw, &[]);
        assert_eq!(read_request(&mut &buf[..], 1, &mut payload).unwrap(), aw);
        // The immediate flag is not an ATOMIC WRITE's; arg1 must be 0.
        let mut bad = buf.clone();
        bad[5] |= 1;
        assert!(read_request(&mut &bad[..], 1, &mut payload).is_err());
        let mut bad = buf.clone();
        bad[40] = 1;
        assert!(matches!(
            read_request(&mut &bad[..], 1, &mut payload),
            Err(WireError::NonZeroReserved)
        ));
    }

    #[test]
    fn response_round_trip() {
        let h = ResponseHeader {
            status: Status::RnrRetryExceeded,
            req_id: 12,
            value: 5,
        };
        let mut buf = Vec::new();
        encode_response(&mut buf, &h, b"xy");
        let mut payload = Vec::new();
        assert_eq!(read_response(&mut &buf[..], &mut payload).unwrap(), h);
        assert_eq!(payload, b"xy");
        buf[4] = 200;
        assert!(read_response(&mut &buf[..], &mut payload).is_err());
    }

    #[test]
    fn hello_proves_secret_and_cluster() {
        let c = cred(b"secret");
        let challenge = Challenge {
            node: NodeId(2),
            nonce: [5; 16],
        };
        let hello = Hello {
            src: QpAddr {
                node: NodeId(1),
                qpn: QpNum(3),
            },
            dst: QpAddr {
                node: NodeId(2),
                qpn: QpNum(4),
            },
            cluster_id: 7,
            nonce: [6; 16],
        };
        let b = hello.encode(&c, &challenge);
        assert_eq!(Hello::verify(&b, &c, &challenge).unwrap(), hello);
        assert!(matches!(
            Hello::verify(&b, &cred(b"other"), &challenge),
            Err(HandshakeError::BadMac)
        ));
        let replay = Challenge {
            nonce: [8; 16],
            ..challenge
        };
        assert!(matches!(
            Hello::verify(&b, &c, &replay),
            Err(HandshakeError::BadMac)
        ));
        let other_cluster = Credentials::new(8, b"secret").unwrap();
        assert!(matches!(
            Hello::verify(&b, &other_cluster, &challenge),
            Err(HandshakeError::WrongCluster { got: 7 })
        ));
        let w = Welcome::Accepted.encode(&c, Some(&hello), &challenge);
        assert_eq!(
            Welcome::verify(&w, &c, &hello, &challenge).unwrap(),
            Welcome::Accepted
        );
        assert!(Welcome::verify(&w, &cred(b"x"), &hello, &challenge).is_err());
    }
}
