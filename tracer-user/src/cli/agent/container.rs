//! Which container a process runs in, from the shape of its cgroup path
//! (`/proc/PID/cgroup`): Docker, containerd/CRI, CRI-O, podman/libpod and
//! Kubernetes (pod UID) layouts, with the systemd (`*.slice`/`*.scope`) and
//! cgroupfs drivers. Nothing is asked of a container runtime.

use std::fs;

/// What the cgroup path says about a process.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ContainerInfo {
    /// The cgroup path (the unified hierarchy's, else the first one naming a container).
    pub cgroup: String,
    /// The container id (64 hex digits), when the path names one.
    pub container_id: Option<String>,
    /// The runtime the path shape belongs to (`docker`, `containerd`, `crio`, `podman`, `kubernetes`).
    pub runtime: Option<&'static str>,
    /// The Kubernetes pod UID (dashes restored), when the path names one.
    pub pod_uid: Option<String>,
    /// The container's name, when the path names it (no common runtime
    /// puts it there; kept for the label set).
    pub container_name: Option<String>,
}

/// Reads `/proc/PID/cgroup`; `None` when the process is gone.
pub fn of_pid(pid: u32) -> Option<ContainerInfo> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some(from_cgroup_file(&text))
}

/// Parses a `/proc/PID/cgroup` file: `hierarchy-id:controllers:path` per
/// line (`0::path` for cgroup v2). The first path that names a container
/// wins; otherwise the unified path (or the first) is kept as is.
pub fn from_cgroup_file(text: &str) -> ContainerInfo {
    let paths: Vec<&str> = text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).collect();
    for p in &paths {
        let info = from_path(p);
        if info.container_id.is_some() || info.pod_uid.is_some() {
            return info;
        }
    }
    let unified = text.lines().find_map(|l| l.strip_prefix("0::")).or_else(|| paths.first().copied()).unwrap_or("");
    ContainerInfo { cgroup: unified.to_owned(), ..Default::default() }
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parses one cgroup path.
pub fn from_path(path: &str) -> ContainerInfo {
    let mut info = ContainerInfo { cgroup: path.to_owned(), ..Default::default() };
    let mut kube = false;
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        let base = comp.strip_suffix(".scope").or_else(|| comp.strip_suffix(".slice")).unwrap_or(comp);
        if base.starts_with("kubepods") {
            kube = true;
        }
        // Pod: `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
        if kube {
            if let Some(i) = base.rfind("pod") {
                let uid = &base[i + 3..];
                if uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_') {
                    info.pod_uid = Some(uid.replace('_', "-"));
                }
            }
        }
        let (runtime, rest) = if let Some(r) = base.strip_prefix("docker-") {
            (Some("docker"), r)
        } else if let Some(r) = base.strip_prefix("cri-containerd-") {
            (Some("containerd"), r)
        } else if let Some(r) = base.strip_prefix("crio-") {
            (Some("crio"), r)
        } else if let Some(r) = base.strip_prefix("libpod-") {
            (Some("podman"), r)
        } else {
            (None, base)
        };
        if is_id(rest) {
            info.container_id = Some(rest.to_owned());
            info.runtime = runtime.or(Some(if kube {
                "kubernetes"
            } else if path.contains("/docker/") || path.starts_with("/docker") {
                "docker"
            } else if path.contains("libpod") {
                "podman"
            } else {
                "containerd"
            }));
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809";

    #[test]
    fn docker_systemd_and_cgroupfs() {
        let i = from_path(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(i.container_id.as_deref(), Some(ID));
        assert_eq!(i.runtime, Some("docker"));
        let i = from_path(&format!("/docker/{ID}"));
        assert_eq!(i.container_id.as_deref(), Some(ID));
        assert_eq!(i.runtime, Some("docker"));
    }

    #[test]
    fn podman_libpod_shapes() {
        // rootful podman with systemd, and with cgroupfs (what runc here gives).
        let i = from_path(&format!("/machine.slice/libpod-{ID}.scope/container"));
        assert_eq!((i.container_id.as_deref(), i.runtime), (Some(ID), Some("podman")));
        let i = from_path(&format!("/libpod_parent/libpod-{ID}"));
        assert_eq!((i.container_id.as_deref(), i.runtime), (Some(ID), Some("podman")));
    }

    #[test]
    fn kubernetes_systemd_and_cgroupfs() {
        let uid = "7d9f6a0e-1b2c-4d3e-8f4a-5b6c7d8e9f01";
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            uid.replace('-', "_")
        );
        let i = from_path(&p);
        assert_eq!(i.container_id.as_deref(), Some(ID));
        assert_eq!(i.pod_uid.as_deref(), Some(uid));
        assert_eq!(i.runtime, Some("containerd"));
        let i = from_path(&format!("/kubepods/besteffort/pod{uid}/{ID}"));
        assert_eq!((i.container_id.as_deref(), i.pod_uid.as_deref(), i.runtime), (Some(ID), Some(uid), Some("kubernetes")));
        let i = from_path(&format!("/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope", uid.replace('-', "_")));
        assert_eq!((i.container_id.as_deref(), i.pod_uid.as_deref(), i.runtime), (Some(ID), Some(uid), Some("crio")));
    }

    #[test]
    fn host_processes_have_no_container() {
        let i = from_path("/user.slice/user-0.slice/session-3.scope");
        assert_eq!(i.container_id, None);
        assert_eq!(i.pod_uid, None);
        let i = from_path("/init.scope");
        assert_eq!(i.container_id, None);
    }

    #[test]
    fn hybrid_hierarchies_pick_the_line_naming_the_container() {
        let text = format!("12:pids:/libpod_parent/libpod-{ID}\n1:name=systemd:/libpod_parent/libpod-{ID}\n0::/\n");
        let i = from_cgroup_file(&text);
        assert_eq!(i.container_id.as_deref(), Some(ID));
        let host = from_cgroup_file("0::/user.slice/session-1.scope\n");
        assert_eq!(host.cgroup, "/user.slice/session-1.scope");
        assert_eq!(host.container_id, None);
    }
}
