//! Builds the kernel programs (`tracer-ebpf`) for bpfel-unknown-none with the
//! nightly toolchain and bpf-linker (`cargo xtask setup` installs both).
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "tracer-ebpf")
        .ok_or_else(|| anyhow!("tracer-ebpf package not found in the workspace"))?;
    let root = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    // The shared types are compiled into the kernel programs too.
    println!("cargo:rerun-if-changed={}", root.join("../tracer-common/src"));
    let pkg = aya_build::Package { name: ebpf.name.as_str(), root_dir: root.as_str(), ..Default::default() };
    aya_build::build_ebpf([pkg], aya_build::Toolchain::default())
        .context("building the eBPF programs failed; run `cargo xtask setup` (nightly rust-src and bpf-linker)")
}
