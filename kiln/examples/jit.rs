//! In this process: a model with a symbolic batch, run at whatever batch each call brings (each
//! new size compiled on its first run), inputs by name, errors with their causes.
//! `cargo run -p kiln --example jit --features examples`.

use kiln::builder::GraphBuilder;
use kiln::{DType, Dim, Options, Session, Tensor};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    // y = relu(x W + b) over a batch `N` known only at run time.
    let g = GraphBuilder::new("dense");
    let x = g.input("x", DType::F32, vec![Dim::sym("N"), Dim::from(32)]);
    let w = g.constant("w", Tensor::random(DType::F32, &[32, 10], 1));
    let b = g.constant("b", Tensor::random(DType::F32, &[10], 2));
    g.output("y", (x.matmul(w) + b).relu());
    let graph = g.build()?;

    let mut session = Session::new(graph, &Options::new().threads(2));
    for batch in [1, 5, 5, 12] {
        let outputs = session.run_named(&[("x", Tensor::random(DType::F32, &[batch, 32], 3))])?;
        let (name, y) = &outputs[0];
        println!("batch {batch}: {name} {:?}", y.dims());
    }
    println!("{} programs compiled for 4 runs", session.compiles());

    // A wrong shape fails the run; the chain says why.
    if let Err(e) = session.run(&[Tensor::random(DType::F32, &[2, 31], 4)]) {
        let mut line = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            line += &format!(": {s}");
            source = s.source();
        }
        println!("as expected: {line}");
    } else {
        return Err("a wrong shape was accepted".into());
    }
    Ok(())
}
