//! The CPU launch pool's synchronisation cost (issue 33): one launch of empty workgroups, back to
//! back (the workers polling) and after an idle gap (the workers asleep, woken by the launch),
//! at 1, 2, 4, 8 and 16 threads, medians. `pool_cost [LAUNCHES]`; `make bench-pool` runs it.
//! Past this machine's cores the threads share them, and the figures say the scheduler's cost.

use std::time::Duration;

use kiln_runtime::device::cpu::launch_overhead;

fn main() {
    let launches: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "CPU launch pool: one launch of empty workgroups (medians; this machine has {cores} cores)"
    );
    println!(
        "{:>8} {:>11} {:>16} {:>20}",
        "threads", "workgroups", "back to back", "after 1 ms asleep"
    );
    for threads in [1usize, 2, 4, 8, 16] {
        let workgroups = 2 * threads as u64;
        let busy = launch_overhead(threads, workgroups, launches, None).expect("threads start");
        let idle = launch_overhead(threads, workgroups, 200, Some(Duration::from_millis(1)))
            .expect("threads start");
        let note = if threads > cores { "  (more threads than cores)" } else { "" };
        println!(
            "{threads:>8} {workgroups:>11} {:>13.2} us {:>17.2} us{note}",
            busy.as_secs_f64() * 1e6,
            idle.as_secs_f64() * 1e6
        );
    }
}
