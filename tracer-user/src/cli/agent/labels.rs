//! The labels every per-target series of `/metrics` carries.

use prometheus_client::encoding::EncodeLabelSet;

/// `pid`, `comm`, and the container the cgroup path names (empty where
/// none): `container_id`, `pod_uid`, `container_name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub pid: String,
    pub comm: String,
    pub container_id: String,
    pub pod_uid: String,
    pub container_name: String,
}
