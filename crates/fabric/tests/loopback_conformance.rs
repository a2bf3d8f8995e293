//! The fabric conformance suite run against `LoopbackFabric`.

use std::sync::Arc;

use rowankv_fabric::conformance::Backend;
use rowankv_fabric::LoopbackFabric;
use rowankv_types::Clock;

struct LoopbackBackend;

impl Backend for LoopbackBackend {
    type F = LoopbackFabric;

    fn fabric(&self) -> LoopbackFabric {
        LoopbackFabric::new()
    }

    fn fabric_with_clock(&self, clock: Arc<dyn Clock>) -> LoopbackFabric {
        LoopbackFabric::with_clock(clock)
    }
}

rowankv_fabric::conformance_suite!(LoopbackBackend);
