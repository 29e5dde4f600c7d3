//! Built-in example models traced with the [`builder`](crate::builder) API, with seeded random
//! weights: the demo's model and small graphs for examples and tests.

use crate::builder::{ConvOptions, GraphBuilder};
use crate::{DType, Graph, Result, Tensor};

/// The small CIFAR-10 CNN (the PyTorch tutorial's): conv 3->6 5x5, maxpool 2, relu, conv 6->16
/// 5x5, maxpool 2, relu, flatten, fully connected 400->120->84->10 with relu between.
/// Input `x: f32[batch,3,32,32]`, output `logits: f32[batch,10]`.
pub fn cifarnet(batch: usize, seed: u64) -> Result<Graph> {
    let g = GraphBuilder::new("cifarnet");
    let mut n = seed;
    // Uniform in ±1/sqrt(fan_in), as PyTorch initialises, so activations stay in range.
    let mut param = |name: &str, dims: &[usize], fan_in: usize| {
        n += 1;
        let t = Tensor::random(DType::F32, dims, n);
        let k = 1.0 / (fan_in as f64).sqrt();
        let scaled = Tensor::from_f64s(
            DType::F32,
            dims,
            &t.to_f64s().iter().map(|v| v * k).collect::<Vec<_>>(),
        )
        .expect("same count");
        g.constant(name, scaled)
    };
    let x = g.input("x", DType::F32, [batch, 3, 32, 32]);
    let c1 = x
        .conv(
            param("conv1.weight", &[6, 3, 5, 5], 75),
            Some(param("conv1.bias", &[6], 75)),
            ConvOptions::default(),
        )
        .named("conv1");
    let p1 = c1.max_pool(2, 2, 0).named("pool1").relu().named("relu1");
    let c2 = p1
        .conv(
            param("conv2.weight", &[16, 6, 5, 5], 150),
            Some(param("conv2.bias", &[16], 150)),
            ConvOptions::default(),
        )
        .named("conv2");
    let p2 = c2.max_pool(2, 2, 0).named("pool2").relu().named("relu2");
    let flat = p2.flatten(1).named("flatten");
    let f1 = flat
        .linear(param("fc1.weight", &[120, 400], 400), param("fc1.bias", &[120], 400))
        .named("fc1")
        .relu()
        .named("relu3");
    let f2 = f1
        .linear(param("fc2.weight", &[84, 120], 120), param("fc2.bias", &[84], 120))
        .named("fc2")
        .relu()
        .named("relu4");
    let logits =
        f2.linear(param("fc3.weight", &[10, 84], 84), param("fc3.bias", &[10], 84)).named("fc3");
    g.output("logits", logits);
    g.build()
}

/// A two-layer perceptron: `relu(x · w1 + b1) · w2 + b2`, input `x: f32[batch,inputs]`.
pub fn mlp(batch: usize, inputs: usize, hidden: usize, outputs: usize, seed: u64) -> Result<Graph> {
    let g = GraphBuilder::new("mlp");
    let x = g.input("x", DType::F32, [batch, inputs]);
    let w1 = g.constant("w1", Tensor::random(DType::F32, &[inputs, hidden], seed));
    let b1 = g.constant("b1", Tensor::random(DType::F32, &[hidden], seed + 1));
    let w2 = g.constant("w2", Tensor::random(DType::F32, &[hidden, outputs], seed + 2));
    let b2 = g.constant("b2", Tensor::random(DType::F32, &[outputs], seed + 3));
    let y = x.matmul(w1).add(b1).relu().matmul(w2).add(b2);
    g.output("y", y);
    g.build()
}

/// One decoding step of a GPT-style decoder with a KV cache: `layers` pre-norm blocks of
/// `heads` heads of `head_dim` (width `d = heads * head_dim`), a 4x GELU-free MLP (ReLU), as
/// exporters write it. Inputs: `x: f32[1,1,d]` (the new token's embedding) and per layer
/// `past_key_i`, `past_value_i: f32[1,heads,"past",head_dim]`; outputs `y: f32[1,1,d]` and per
/// layer `present_key_i`, `present_value_i` (the cache with the new position appended). The
/// attention is `softmax(q k^T / sqrt(head_dim)) v` over every cached position and the new one.
pub fn gpt_decoder_step(layers: usize, heads: usize, head_dim: usize, seed: u64) -> Result<Graph> {
    let g = GraphBuilder::new("gpt_decoder_step");
    let d = heads * head_dim;
    let mut n = seed;
    let mut param = |name: &str, dims: &[usize], scale: f64| {
        n += 1;
        let t = Tensor::random(DType::F32, dims, n);
        let scaled = Tensor::from_f64s(
            DType::F32,
            dims,
            &t.to_f64s().iter().map(|v| v * scale).collect::<Vec<_>>(),
        )
        .expect("same count");
        g.constant(name, scaled)
    };
    let w = 1.0 / (d as f64).sqrt();
    let mut x = g.input("x", DType::F32, [1, 1, d]);
    let mut caches = Vec::new();
    for l in 0..layers {
        let cache = |which: &str| {
            g.input(
                &format!("past_{which}_{l}"),
                DType::F32,
                vec![1.into(), heads.into(), crate::Dim::sym("past"), head_dim.into()],
            )
        };
        let (past_k, past_v) = (cache("key"), cache("value"));
        let h = x.layer_norm(
            param(&format!("ln1_{l}.weight"), &[d], 0.1),
            param(&format!("ln1_{l}.bias"), &[d], 0.1),
            -1,
            1e-5,
        );
        // [1, 1, d] -> [1, heads, 1, head_dim]
        let split = [1, 1, heads as i64, head_dim as i64];
        let q = h
            .matmul(param(&format!("q_{l}.weight"), &[d, d], w))
            .reshape(&split)
            .transpose(&[0, 2, 1, 3]);
        let k = h
            .matmul(param(&format!("k_{l}.weight"), &[d, d], w))
            .reshape(&split)
            .transpose(&[0, 2, 1, 3]);
        let v = h
            .matmul(param(&format!("v_{l}.weight"), &[d, d], w))
            .reshape(&split)
            .transpose(&[0, 2, 1, 3]);
        let keys = g.concat(&[past_k, k], 2).named(&format!("present_key_{l}"));
        let values = g.concat(&[past_v, v], 2).named(&format!("present_value_{l}"));
        let scores =
            q.matmul(keys.transpose(&[0, 1, 3, 2])) * q.scalar(1.0 / (head_dim as f64).sqrt());
        let a =
            scores.softmax(-1).matmul(values).transpose(&[0, 2, 1, 3]).reshape(&[1, 1, d as i64]);
        x = x + a.matmul(param(&format!("o_{l}.weight"), &[d, d], w));
        let h = x.layer_norm(
            param(&format!("ln2_{l}.weight"), &[d], 0.1),
            param(&format!("ln2_{l}.bias"), &[d], 0.1),
            -1,
            1e-5,
        );
        let up = h.matmul(param(&format!("up_{l}.weight"), &[d, 4 * d], w)).relu();
        x = x + up.matmul(param(&format!("down_{l}.weight"), &[4 * d, d], 0.5 * w));
        caches.push((keys, values));
    }
    g.output("y", x);
    for (l, (k, v)) in caches.into_iter().enumerate() {
        g.output(&format!("present_key_{l}"), k);
        g.output(&format!("present_value_{l}"), v);
    }
    g.build()
}
