//! kiln-runtime: loads compiled kiln artifacts and runs them on a device.
//!
//! This crate never depends on MLIR or LLVM (`make test` checks it), so an ahead-of-time artifact
//! runs on a machine that has only the runtime:
//!
//! ```no_run
//! use kiln_runtime::{Executable, LoadOptions};
//! use kiln_ir::{DType, Tensor};
//! let exe = Executable::load_file("model.kiln".as_ref(), &LoadOptions::default())?;
//! let outputs = exe.run(&[Tensor::zeros(DType::F32, &[1, 3, 224, 224])])?;
//! # Ok::<(), kiln_runtime::RuntimeError>(())
//! ```

pub mod artifact;
pub mod device;
mod error;
mod executable;
pub mod files;
pub mod memory;
pub mod status;

pub use artifact::{Artifact, Target};
pub use device::{auto_device, list_devices, DeviceInfo};
pub use error::{Result, RuntimeError};
pub use executable::{cpu_description, CopySpan, Executable, LoadOptions, Profile, Track};
