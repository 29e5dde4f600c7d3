//! Specialisation: binds symbolic input dimensions to concrete sizes, re-infers every type, and
//! folds what became constant, so codegen sees only static shapes.

use std::collections::HashMap;

use kiln_ir::{Dim, Graph, Shape, TensorType};

use crate::{CompileError, Result};

/// Gives input `name` the concrete `dims` (from `--input-shape` or the tensors a run gets).
/// Every input must end up fully known.
pub fn specialize(graph: &mut Graph, shapes: &HashMap<String, Vec<usize>>) -> Result<()> {
    let names: Vec<String> = graph.inputs().iter().map(|&id| graph.node(id).name.clone()).collect();
    if let Some(unknown) = shapes.keys().find(|k| !names.contains(k)) {
        return Err(CompileError::Usage(format!("--input-shape names `{unknown}`, but the model's inputs are: {}", names.join(", "))));
    }
    let mut bound: HashMap<String, usize> = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let declared = graph.node(graph.inputs()[i]).outputs[0].clone();
        let dims: Vec<usize> = match shapes.get(name) {
            Some(d) => {
                check_shape(name, &declared, d, &mut bound)?;
                d.clone()
            }
            None => match declared.shape.as_fixed() {
                Some(d) => d,
                None => {
                    // Symbols already bound by an earlier input carry over.
                    let d: Option<Vec<usize>> = declared
                        .shape
                        .dims()
                        .iter()
                        .map(|d| match d {
                            Dim::Fixed(n) => Some(*n),
                            Dim::Sym(s) => bound.get(&**s).copied(),
                        })
                        .collect();
                    d.ok_or_else(|| {
                        CompileError::Usage(format!(
                            "input `{name}` has the dynamic shape {declared}; give its size with --input-shape {name}=D0,D1,..."
                        ))
                    })?
                }
            },
        };
        if declared.shape.as_fixed().as_deref() != Some(dims.as_slice()) {
            graph.set_input_type(i, TensorType::new(declared.dtype, Shape::fixed(&dims)))?;
        }
    }
    Ok(())
}

fn check_shape(name: &str, declared: &TensorType, dims: &[usize], bound: &mut HashMap<String, usize>) -> Result<()> {
    let bad = || CompileError::Usage(format!("input `{name}` is {declared}, which the shape {dims:?} does not fit"));
    if dims.len() != declared.rank() {
        return Err(bad());
    }
    for (d, &n) in declared.shape.dims().iter().zip(dims) {
        match d {
            Dim::Fixed(m) if *m != n => return Err(bad()),
            Dim::Sym(s) => {
                if let Some(&prev) = bound.get(&**s) {
                    if prev != n {
                        return Err(CompileError::Usage(format!("`{s}` is {prev} in an earlier input but {n} in `{name}`")));
                    }
                }
                bound.insert(s.to_string(), n);
            }
            _ => {}
        }
    }
    Ok(())
}
