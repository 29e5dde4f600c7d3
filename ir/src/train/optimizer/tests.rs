//! Each optimizer against its formulas written out in f64 (as PyTorch's `torch.optim` documents
//! them), over three steps that feed the new parameter and state back in, so the state and the
//! step count's bias correction are exercised, not just the first step.

use super::{append_update, OptimError, Optimizer, Slot};
use crate::{eval, DType, Graph, Tensor, TensorType, ValueId};

const N: usize = 5;
const STEPS: usize = 3;

/// A graph of one parameter of N elements: inputs p, g, the state, and the step (i64); outputs
/// the new parameter then the new state.
fn step_graph(opt: &Optimizer, dtype: DType) -> Graph {
    let mut graph = Graph::new("step");
    let ty = TensorType::new(dtype, [N]);
    let input = |graph: &mut Graph, name: &str| graph.add_input(name, ty.clone()).expect("input");
    let param = input(&mut graph, "p");
    let grad = input(&mut graph, "g");
    let state: Vec<ValueId> =
        (0..opt.state_len()).map(|i| input(&mut graph, &format!("s{i}"))).collect();
    let step = graph.add_input("t", TensorType::new(DType::I64, [])).expect("input");
    let slot = Slot { param, grad, state };
    let up = append_update(&mut graph, opt, Some(step), &[slot]).expect("update builds");
    graph.add_output("p_new", up[0].param).expect("output");
    for (i, s) in up[0].state.iter().enumerate() {
        graph.add_output(&format!("s{i}_new"), *s).expect("output");
    }
    graph
}

/// Runs `opt` for STEPS steps from a fixed parameter with fixed gradients; the parameter after
/// each step.
fn run(opt: &Optimizer, dtype: DType) -> Vec<Vec<f64>> {
    let graph = step_graph(opt, dtype);
    let mut p = start();
    let mut state = vec![vec![0.0; N]; opt.state_len()];
    let mut out = Vec::new();
    for t in 1..=STEPS {
        let t64 = |v: &[f64]| Tensor::from_f64s(dtype, &[N], v).expect("length");
        let mut inputs = vec![t64(&p), t64(&grad(t))];
        inputs.extend(state.iter().map(|s| t64(s)));
        inputs.push(Tensor::scalar(t as i64));
        let r = eval::run(&graph, &inputs).expect("the step runs");
        p = r[0].to_f64s();
        state = r[1..].iter().map(Tensor::to_f64s).collect();
        out.push(p.clone());
    }
    out
}

fn start() -> Vec<f64> {
    vec![0.5, -1.25, 2.0, 0.0, -0.3]
}

/// The gradient at step t (1-based): fixed, and different each step.
fn grad(t: usize) -> Vec<f64> {
    let base = [0.1, -0.4, 0.25, 1.5, -2.0];
    base.iter().enumerate().map(|(i, g)| g * t as f64 - 0.05 * i as f64).collect()
}

fn assert_close(name: &str, got: &[Vec<f64>], want: &[Vec<f64>], tol: f64) {
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "{name}: step {}, element {i}: got {a}, want {b}",
                t + 1
            );
        }
    }
}

/// torch.optim.SGD: g = ∇ + wd·p; b = g at step 1, μb + g after; p -= lr·(g + μb) (Nesterov)
/// or lr·b.
fn sgd_reference(lr: f64, mu: f64, nesterov: bool, wd: f64) -> Vec<Vec<f64>> {
    let mut p = start();
    let mut b = [0.0; N];
    let mut out = Vec::new();
    for t in 1..=STEPS {
        let gr = grad(t);
        for i in 0..N {
            let g = gr[i] + wd * p[i];
            let d = if mu == 0.0 {
                g
            } else {
                b[i] = if t == 1 { g } else { mu * b[i] + g };
                if nesterov {
                    g + mu * b[i]
                } else {
                    b[i]
                }
            };
            p[i] -= lr * d;
        }
        out.push(p.clone());
    }
    out
}

/// torch.optim.Adam (L2 weight decay) and AdamW (decoupled): m̂ = m/(1-β₁ᵗ), v̂ = v/(1-β₂ᵗ),
/// p -= lr·m̂/(√v̂ + ε).
fn adam_reference(lr: f64, b1: f64, b2: f64, eps: f64, wd: f64, decoupled: bool) -> Vec<Vec<f64>> {
    let mut p = start();
    let (mut m, mut v) = ([0.0; N], [0.0; N]);
    let mut out = Vec::new();
    for t in 1..=STEPS {
        let gr = grad(t);
        for i in 0..N {
            let g = if decoupled { gr[i] } else { gr[i] + wd * p[i] };
            if decoupled {
                p[i] *= 1.0 - lr * wd;
            }
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let m_hat = m[i] / (1.0 - b1.powi(t as i32));
            let v_hat = v[i] / (1.0 - b2.powi(t as i32));
            p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
        }
        out.push(p.clone());
    }
    out
}

#[test]
fn sgd_plain_momentum_nesterov_and_weight_decay() {
    for (mu, nesterov, wd) in [
        (0.0, false, 0.0),
        (0.0, false, 0.1),
        (0.9, false, 0.0),
        (0.9, true, 0.0),
        (0.8, true, 0.05),
    ] {
        let opt = Optimizer::Sgd { lr: 0.1, momentum: mu, nesterov, weight_decay: wd };
        let name = format!("{opt:?}");
        assert_close(&name, &run(&opt, DType::F64), &sgd_reference(0.1, mu, nesterov, wd), 1e-12);
    }
}

#[test]
fn adam_and_adamw() {
    let cases = [
        Optimizer::adam(0.01),
        Optimizer::Adam { lr: 0.05, beta1: 0.8, beta2: 0.99, epsilon: 1e-6, weight_decay: 0.1 },
        Optimizer::adamw(0.01),
        Optimizer::AdamW { lr: 0.05, beta1: 0.8, beta2: 0.99, epsilon: 1e-6, weight_decay: 0.1 },
    ];
    for opt in cases {
        let want = match opt {
            Optimizer::Adam { lr, beta1, beta2, epsilon, weight_decay } => {
                adam_reference(lr, beta1, beta2, epsilon, weight_decay, false)
            }
            Optimizer::AdamW { lr, beta1, beta2, epsilon, weight_decay } => {
                adam_reference(lr, beta1, beta2, epsilon, weight_decay, true)
            }
            Optimizer::Sgd { .. } => unreachable!("only Adam cases"),
        };
        assert_close(&format!("{opt:?}"), &run(&opt, DType::F64), &want, 1e-12);
    }
}

#[test]
fn adam_by_hand_one_step() {
    // Step 1 of Adam is p - lr·sign(g) (up to ε): m̂ = g, v̂ = g².
    let got = run(&Optimizer::adam(0.01), DType::F64);
    let g = grad(1);
    let want: Vec<f64> =
        start().iter().zip(&g).map(|(p, g)| p - 0.01 * g / (g.abs() + 1e-8)).collect();
    assert_close("adam step 1", &got[..1], &[want], 1e-12);
}

#[test]
fn f32_parameters_update_in_f32() {
    let opt = Optimizer::adamw(0.01);
    let graph = step_graph(&opt, DType::F32);
    assert!(graph.outputs().iter().all(|(_, v)| graph.value_type(*v).dtype == DType::F32));
    let want = adam_reference(0.01, 0.9, 0.999, 1e-8, 0.01, true);
    assert_close("adamw f32", &run(&opt, DType::F32), &want, 1e-5);
}

#[test]
fn bad_slots_are_typed_errors_and_leave_the_graph_unchanged() {
    let mut graph = Graph::new("bad");
    let p = graph.add_input("p", TensorType::new(DType::F32, [3])).expect("input");
    let g = graph.add_input("g", TensorType::new(DType::F32, [3])).expect("input");
    let g64 = graph.add_input("g64", TensorType::new(DType::F64, [3])).expect("input");
    let before = graph.nodes().count();
    let adam = Optimizer::adam(0.1);
    let slot = |grad, n: usize| Slot { param: p, grad, state: vec![p; n] };
    let e = append_update(&mut graph, &adam, None, &[slot(g, 2)]).unwrap_err();
    assert_eq!(e, OptimError::NoStep { optimizer: "Adam" });
    let e = append_update(&mut graph, &adam, Some(p), &[slot(g, 2)]).unwrap_err();
    assert!(matches!(e, OptimError::Step { .. }), "{e}");
    let sgd = Optimizer::Sgd { lr: 0.1, momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    let e = append_update(&mut graph, &sgd, None, &[slot(g, 0)]).unwrap_err();
    assert!(matches!(e, OptimError::StateCount { index: 0, want: 1, got: 0, .. }), "{e}");
    let e = append_update(&mut graph, &sgd, None, &[slot(g64, 1)]).unwrap_err();
    assert!(matches!(e, OptimError::Mismatch { what: "gradient", .. }), "{e}");
    assert_eq!(graph.nodes().count(), before);
}

/// The rate read from an input (`append_update_at`) steps as the optimizer's constant does,
/// for every optimizer (AdamW's decay reads it too); a rate of another shape is refused.
#[test]
fn rate_as_an_input_steps_as_the_constant() {
    let opts = [
        Optimizer::Sgd { lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01 },
        Optimizer::Adam { lr: 0.05, beta1: 0.9, beta2: 0.99, epsilon: 1e-8, weight_decay: 0.1 },
        Optimizer::AdamW { lr: 0.05, beta1: 0.9, beta2: 0.99, epsilon: 1e-8, weight_decay: 0.1 },
    ];
    for opt in opts {
        let lr = match opt {
            Optimizer::Sgd { lr, .. }
            | Optimizer::Adam { lr, .. }
            | Optimizer::AdamW { lr, .. } => lr,
        };
        // The same optimizer with a wrong constant: only the input's rate can give the steps.
        let wrong = match opt {
            Optimizer::Sgd { momentum, nesterov, weight_decay, .. } => {
                Optimizer::Sgd { lr: 7.0, momentum, nesterov, weight_decay }
            }
            Optimizer::Adam { beta1, beta2, epsilon, weight_decay, .. } => {
                Optimizer::Adam { lr: 7.0, beta1, beta2, epsilon, weight_decay }
            }
            Optimizer::AdamW { beta1, beta2, epsilon, weight_decay, .. } => {
                Optimizer::AdamW { lr: 7.0, beta1, beta2, epsilon, weight_decay }
            }
        };
        let mut graph = Graph::new("step");
        let ty = TensorType::new(DType::F64, [N]);
        let param = graph.add_input("p", ty.clone()).expect("input");
        let grad_in = graph.add_input("g", ty.clone()).expect("input");
        let state: Vec<ValueId> = (0..opt.state_len())
            .map(|i| graph.add_input(&format!("s{i}"), ty.clone()).expect("input"))
            .collect();
        let step = graph.add_input("t", TensorType::new(DType::I64, [])).expect("input");
        let rate = graph.add_input("lr", TensorType::new(DType::F32, [])).expect("input");
        let slot = Slot { param, grad: grad_in, state };
        let bad = graph.add_input("bad", TensorType::new(DType::F32, [2])).expect("input");
        let refused =
            super::append_update_at(&mut graph, &wrong, Some(step), Some(bad), &[slot.clone()]);
        assert!(matches!(refused, Err(OptimError::Rate { .. })), "{refused:?}");
        let up = super::append_update_at(&mut graph, &wrong, Some(step), Some(rate), &[slot])
            .expect("update builds");
        graph.add_output("p_new", up[0].param).expect("output");
        for (i, s) in up[0].state.iter().enumerate() {
            graph.add_output(&format!("s{i}_new"), *s).expect("output");
        }
        let mut p = start();
        let mut st = vec![vec![0.0; N]; opt.state_len()];
        let mut got = Vec::new();
        for t in 1..=STEPS {
            let t64 = |v: &[f64]| Tensor::from_f64s(DType::F64, &[N], v).expect("length");
            let mut inputs = vec![t64(&p), t64(&grad(t))];
            inputs.extend(st.iter().map(|s| t64(s)));
            inputs.push(Tensor::scalar(t as i64));
            inputs.push(Tensor::scalar(lr as f32));
            inputs.push(Tensor::from_f64s(DType::F32, &[2], &[0.0, 0.0]).expect("length"));
            let r = eval::run(&graph, &inputs).expect("the step runs");
            p = r[0].to_f64s();
            st = r[1..].iter().map(Tensor::to_f64s).collect();
            got.push(p.clone());
        }
        // The rate went through f32: 1e-7 relative.
        assert_close(opt.name(), &got, &run(&opt, DType::F64), 1e-6);
    }
}
