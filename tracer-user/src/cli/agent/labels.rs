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

/// A call site as a label value: `file:LINE function` (the file's base
/// name), or the function alone.
pub fn site_label(function: &str, file: Option<&str>, line: Option<u32>) -> String {
    match (file, line) {
        (Some(f), Some(l)) => format!("{}:{} {}", f.rsplit('/').next().unwrap_or(f), l, function),
        _ => function.to_owned(),
    }
}
