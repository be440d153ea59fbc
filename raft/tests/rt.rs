//! openraft's own runtime conformance suite against the glommio runtime.

use futureq_raft::rt::GlommioRuntime;

#[test]
fn openraft_runtime_suite_passes_on_glommio() {
    openraft_rt::testing::Suite::<GlommioRuntime>::test_all();
}
