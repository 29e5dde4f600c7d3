//! `kiln._kiln.TrainSession`: `kiln_compiler::TrainSession` for Python (`kiln.training`). The
//! model is an ONNX file or bytes; its loss is a scalar output, or softmax cross-entropy added
//! over a logits output (`logits=`, which adds the int64 input `labels`). Batches are numpy
//! arrays in the step's input order; parameters come back as new numpy arrays.

use std::path::PathBuf;

use kiln_compiler::train::with_cross_entropy;
use kiln_compiler::{TrainError, TrainOptions, TrainSession};
use kiln_ir::train::Optimizer;
use kiln_ir::{Graph, Tensor};
use kiln_runtime::LoadOptions;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::{array_of, device_target, message, model_bytes, options_for, tensor_of, KilnError};

fn train_err(e: TrainError) -> PyErr {
    KilnError::new_err(message(&e))
}

/// The ONNX model's bytes (kept for `save_onnx`) and its graph.
fn read_onnx(model: &Bound<'_, PyAny>) -> PyResult<(Vec<u8>, Graph)> {
    let (bytes, dir, label) = model_bytes(model)?;
    if bytes.starts_with(kiln_runtime::artifact::MAGIC) {
        return Err(KilnError::new_err(format!(
            "{label}: a compiled artifact cannot be trained; give the ONNX model"
        )));
    }
    let m = kiln_ir::onnx::load_bytes(&bytes, dir.as_deref())
        .map_err(|e| KilnError::new_err(format!("{label}: {}", message(&e))))?;
    Ok((bytes, m.graph))
}

/// The optimizer by name, with PyTorch's defaults for what is not given.
fn optimizer_of(
    name: &str,
    lr: f64,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
    betas: (f64, f64),
    eps: f64,
) -> PyResult<Optimizer> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "sgd" => Optimizer::Sgd { lr, momentum, nesterov, weight_decay },
        "adam" => {
            Optimizer::Adam { lr, beta1: betas.0, beta2: betas.1, epsilon: eps, weight_decay }
        }
        "adamw" => {
            Optimizer::AdamW { lr, beta1: betas.0, beta2: betas.1, epsilon: eps, weight_decay }
        }
        other => {
            return Err(KilnError::new_err(format!(
                "unknown optimizer `{other}` (sgd, adam or adamw)"
            )))
        }
    })
}

#[pyclass(module = "kiln._kiln", name = "TrainSession")]
pub(crate) struct PyTrainSession {
    session: TrainSession,
    /// The step's batch inputs: (name, type), for converting what `step` is given.
    batch: Vec<(String, kiln_ir::DType)>,
    /// The ONNX model the session was made from, whose initializers `save_onnx` replaces.
    source: Vec<u8>,
    loss: String,
}

#[pymethods]
impl PyTrainSession {
    #[new]
    #[pyo3(signature = (model, params, optimizer = "sgd", *, loss = None, logits = None, lr = 0.01, momentum = 0.0, nesterov = false, weight_decay = 0.0, betas = (0.9, 0.999), eps = 1e-8, device = "cpu", threads = None, precision = "f32"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        params: Vec<String>,
        optimizer: &str,
        loss: Option<String>,
        logits: Option<String>,
        lr: f64,
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
        betas: (f64, f64),
        eps: f64,
        device: &str,
        threads: Option<usize>,
        precision: &str,
    ) -> PyResult<PyTrainSession> {
        let precision: kiln_compiler::Precision = precision.parse().map_err(KilnError::new_err)?;
        let (source, graph) = read_onnx(model)?;
        let (graph, loss) = match (loss, logits) {
            (Some(_), Some(_)) => {
                return Err(KilnError::new_err(
                    "give loss= (a scalar output) or logits= (cross-entropy added), not both",
                ))
            }
            (Some(l), None) => (graph, l),
            (None, Some(z)) => (with_cross_entropy(&graph, &z).map_err(train_err)?, "loss".into()),
            (None, None) => {
                return Err(KilnError::new_err(
                    "give loss= (the name of a scalar output) or logits= (an output of class scores; softmax cross-entropy against an int64 input `labels` is added)",
                ))
            }
        };
        let opt = optimizer_of(optimizer, lr, momentum, nesterov, weight_decay, betas, eps)?;
        let options = TrainOptions {
            compile: kiln_compiler::Options {
                cache: false,
                ..options_for(device_target(device)?, None, "f32")?
            },
            load: LoadOptions { threads, ..Default::default() },
            lr: None,
            precision,
        };
        let batch = graph
            .inputs()
            .iter()
            .map(|&i| {
                let n = graph.node(i);
                (n.name.clone(), n.outputs[0].dtype)
            })
            .collect();
        let names: Vec<&str> = params.iter().map(String::as_str).collect();
        let session = py
            .detach(|| TrainSession::new(&graph, &loss, &names, opt, options))
            .map_err(train_err)?;
        Ok(PyTrainSession { session, batch, source, loss })
    }

    /// One step on a batch (numpy arrays in the order of `batch_names`); returns the loss
    /// before the update.
    #[pyo3(signature = (*batch))]
    fn step(&mut self, py: Python<'_>, batch: &Bound<'_, PyTuple>) -> PyResult<f32> {
        // step([x, y]) as well as step(x, y).
        let items: Vec<Bound<'_, PyAny>> = match batch.len() {
            1 if batch.get_item(0)?.cast::<PyList>().is_ok()
                || batch.get_item(0)?.cast::<PyTuple>().is_ok() =>
            {
                batch.get_item(0)?.try_iter()?.collect::<PyResult<_>>()?
            }
            _ => batch.iter().collect(),
        };
        if items.len() != self.batch.len() {
            let names: Vec<&str> = self.batch.iter().map(|(n, _)| n.as_str()).collect();
            return Err(KilnError::new_err(format!(
                "the step takes {} batch input(s) ({}), given {}",
                self.batch.len(),
                names.join(", "),
                items.len()
            )));
        }
        let mut tensors = Vec::with_capacity(items.len());
        for ((name, dtype), obj) in self.batch.iter().zip(&items) {
            tensors.push(tensor_of(py, name, *dtype, obj)?);
        }
        let session = &mut self.session;
        py.detach(|| session.step(&tensors)).map_err(train_err)
    }

    /// The step's batch inputs, in the order `step` takes them.
    #[getter]
    fn batch_names(&self) -> Vec<String> {
        self.batch.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The parameters' names, in order.
    #[getter]
    fn param_names(&self) -> Vec<String> {
        self.session.param_names().to_vec()
    }

    /// The loss's output name.
    #[getter]
    fn loss_name(&self) -> String {
        self.loss.clone()
    }

    /// Steps taken.
    #[getter]
    fn steps(&self) -> u64 {
        self.session.steps()
    }

    /// The learning rate of the next step; setting it recompiles nothing.
    #[getter]
    fn get_lr(&self) -> f64 {
        self.session.lr()
    }

    #[setter]
    fn set_lr(&mut self, lr: f64) -> PyResult<()> {
        self.session.set_lr(lr).map_err(train_err)
    }

    /// Parameter `name`'s value now, as a new numpy array.
    fn param<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        array_of(py, self.session.param(name).map_err(train_err)?)
    }

    /// Sets parameter `name` (its type and shape kept).
    fn set_param(&mut self, py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let dtype = self.session.param(name).map_err(train_err)?.dtype();
        let t: Tensor = tensor_of(py, name, dtype, value)?;
        self.session.set_param(name, t).map_err(train_err)
    }

    /// Every parameter by name, as numpy arrays.
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, t) in self.session.params() {
            d.set_item(name, array_of(py, &t)?)?;
        }
        Ok(d)
    }

    /// Every running statistic of a training-mode BatchNormalization (its running mean and
    /// variance initializers) by name, as numpy arrays: their values after the steps taken,
    /// which each step updates itself (`running·momentum + batch·(1 - momentum)`).
    fn running_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, t) in self.session.running_stats() {
            d.set_item(name, array_of(py, &t)?)?;
        }
        Ok(d)
    }

    /// Writes the model with each parameter's (and each training-mode BatchNormalization's
    /// running statistic's) initializer replaced by its value now.
    fn save_onnx(&self, path: PathBuf) -> PyResult<()> {
        let out = kiln_ir::onnx::replace_initializers(&self.source, &self.session.trained())
            .map_err(|e| KilnError::new_err(message(&e)))?;
        std::fs::write(&path, out)
            .map_err(|e| KilnError::new_err(format!("{}: {e}", path.display())))
    }
}
