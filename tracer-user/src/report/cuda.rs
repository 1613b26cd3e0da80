//! The CUDA section of the text report (rendering lives with the CUDA
//! tracer, in `crate::cuda::render`).

pub use crate::cuda::render::render_text;
