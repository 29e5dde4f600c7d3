//! Loop: the length of its stacked results as inference knows it, the interpreter's steps (a
//! condition that stops the loop early), and the text form's round trip.

use std::sync::Arc;

use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{Loop, Subgraph};
use kiln_ir::{eval, text, BinaryOp, DType, Graph, Op, Shape, Tensor};

/// The body: `acc += step`; the condition is `step < stop` when `stop_at` is given, else passed
/// on; stacks `acc`.
fn body(stop_at: Option<i64>) -> Subgraph {
    let b = GraphBuilder::new("body");
    let step = b.input("step", DType::I64, Shape::scalar());
    let cond = b.input("cond", DType::Bool, Shape::scalar());
    let acc = b.input("acc", DType::I64, [1]);
    let next = acc + step;
    let go = match stop_at {
        Some(s) => b.apply(
            Op::Binary(BinaryOp::Less),
            &[Some(step), Some(b.constant("stop", Tensor::scalar::<i64>(s)))],
            1,
        )[0],
        None => cond.identity(),
    };
    b.output("go", go);
    b.output("acc_next", next);
    b.output("seen", next);
    Subgraph(Arc::new(b.build().unwrap()))
}

/// `Loop(trip count n, condition c?, acc)`: `n` a constant or an input, `c` a constant true or
/// an input.
fn counted(n: Option<i64>, cond_input: bool, stop_at: Option<i64>) -> Graph {
    let g = GraphBuilder::new("counted");
    let acc = g.input("acc", DType::I64, [1]);
    let n = match n {
        Some(n) => g.constant("n", Tensor::scalar::<i64>(n)),
        None => g.input("n", DType::I64, Shape::scalar()),
    };
    let c = if cond_input {
        g.input("c", DType::Bool, Shape::scalar())
    } else {
        g.constant("c", Tensor::scalar(true))
    };
    let out = g.apply(
        Op::Loop(Box::new(Loop { body: body(stop_at), captures: 0 })),
        &[Some(n), Some(c), Some(acc)],
        2,
    );
    g.output("acc_last", out[0]);
    g.output("seen", out[1]);
    g.build().unwrap()
}

fn stacked_type(g: &Graph) -> String {
    g.value_type(g.outputs()[1].1).to_string()
}

#[test]
fn a_loop_knows_its_length_when_its_trip_count_and_condition_decide_it() {
    assert_eq!(stacked_type(&counted(Some(4), false, None)), "i64[4,1]");
    assert_eq!(stacked_type(&counted(Some(0), false, None)), "i64[0,1]");
    // A trip count or a first condition known at run time, or a body that decides when to stop:
    // the number of steps is a symbol.
    assert_eq!(stacked_type(&counted(None, false, None)), "i64[\"loop.steps\",1]");
    assert_eq!(stacked_type(&counted(Some(4), true, None)), "i64[\"loop.steps\",1]");
    assert_eq!(stacked_type(&counted(Some(4), false, Some(1))), "i64[\"loop.steps\",1]");
}

#[test]
fn the_interpreter_runs_until_the_trip_count_or_the_condition_stops_it() {
    let acc = Tensor::vector(&[10i64]);
    let out = eval::run(&counted(Some(4), false, None), std::slice::from_ref(&acc)).unwrap();
    assert_eq!(out[0].to_i64s(), vec![16]);
    assert_eq!((out[1].dims(), out[1].to_i64s()), (&[4usize, 1][..], vec![10, 11, 13, 16]));
    // The body stops after the step where `step < 1` is false: steps 0 and 1 run.
    let out = eval::run(&counted(Some(4), false, Some(1)), std::slice::from_ref(&acc)).unwrap();
    assert_eq!((out[1].dims(), out[1].to_i64s()), (&[2usize, 1][..], vec![10, 11]));
    // A false first condition runs no step.
    let out =
        eval::run(&counted(Some(4), true, None), &[acc.clone(), Tensor::scalar(false)]).unwrap();
    assert_eq!((out[0].to_i64s(), out[1].dims()), (vec![10], &[0usize, 1][..]));
}

#[test]
fn a_loop_round_trips_through_the_text_form() {
    let g = counted(Some(3), true, Some(1));
    let printed = g.to_string();
    let back = text::parse(&printed).unwrap();
    assert_eq!(back.to_string(), printed);
    let x = [Tensor::vector(&[1i64]), Tensor::scalar(true)];
    assert_eq!(eval::run(&back, &x).unwrap(), eval::run(&g, &x).unwrap());
}

/// `Loop(no trip count, true, acc)`: only the body's condition ends it, after step `stop_at`
/// (steps 0 to `stop_at`), or never.
fn conditioned(stop_at: Option<i64>) -> Graph {
    let g = GraphBuilder::new("conditioned");
    let acc = g.input("acc", DType::I64, [1]);
    let c = g.constant("c", Tensor::scalar(true));
    let out = g.apply(
        Op::Loop(Box::new(Loop { body: body(stop_at), captures: 0 })),
        &[None, Some(c), Some(acc)],
        2,
    );
    g.output("acc_last", out[0]);
    g.output("seen", out[1]);
    g.build().unwrap()
}

#[test]
fn a_loop_stops_at_max_loop_steps_naming_the_node() {
    let acc = Tensor::vector(&[0i64]);
    let limited = eval::EvalOptions { max_loop_steps: Some(1000) };
    // A condition that never turns false: ONNX runs it forever; the limit stops it.
    let g = conditioned(None);
    let loop_name = g.node(g.outputs()[0].1.node).name.clone();
    let e = eval::run_with(&g, std::slice::from_ref(&acc), &limited).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("evaluating node `{loop_name}` (Loop): reached the limit of 1000 steps without ending (--max-loop-steps / EvalOptions::max_loop_steps: raise it, or leave it unset for no limit)")
    );
    // One that ends within the limit, or right at it, runs as before.
    for stop_at in [10, 999] {
        let g = conditioned(Some(stop_at));
        let out = eval::run_with(&g, std::slice::from_ref(&acc), &limited).unwrap();
        assert_eq!(out, eval::run(&g, std::slice::from_ref(&acc)).unwrap());
        assert_eq!(out[1].dims(), &[stop_at as usize + 1, 1]);
    }
    // One step past it is refused, trip count or not.
    let e = eval::run_with(&conditioned(Some(1000)), std::slice::from_ref(&acc), &limited);
    assert!(e.unwrap_err().to_string().contains("reached the limit of 1000 steps"));
    let few = eval::EvalOptions { max_loop_steps: Some(3) };
    let e = eval::run_with(&counted(Some(4), false, None), std::slice::from_ref(&acc), &few);
    assert!(e.unwrap_err().to_string().contains("reached the limit of 3 steps"));
    assert!(
        eval::run_with(&counted(Some(3), false, None), std::slice::from_ref(&acc), &few).is_ok()
    );
}
