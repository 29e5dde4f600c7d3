//! Devices: where kernels run. One dispatch model for all of them: a kernel is a grid of
//! workgroups, and a launch runs all of its workgroups on the launch's buffers.

pub mod cpu;
pub(crate) mod hazard;
