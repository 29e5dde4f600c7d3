//! The IR-level pieces of a training step beyond the gradients (`crate::grad`): optimizer updates
//! built from ordinary elementwise ops, so they fuse into elementwise kernels on every target with
//! no op of their own. The ONNX training domain's optimizers (`ai.onnx.preview.training`) are
//! imported through the same update math (`onnx::training`). Batch normalisation in training mode
//! is built from existing ops the same way, and so is training-mode Dropout (its mask from a
//! counter-based hash of the seed). Mixed precision is a transform of the step graph
//! ([`autocast`]): contractions read bf16-rounded operands and sum in f32.

pub mod autocast;
pub mod dropout;
pub mod normalize;
pub mod optimizer;

pub use autocast::{autocast, Autocast, CastNode};
pub use dropout::{dropout, Dropout};
pub use normalize::{batch_norm_training, running_statistics, BatchNormTraining, RunningStat};
pub use optimizer::{append_update, append_update_at, OptimError, Optimizer, Slot, Update};
