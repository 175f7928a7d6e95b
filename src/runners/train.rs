//! The `train` runner: one trial of a job in the foreground, with its loss and accuracy printed each epoch.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::plan::{self, MIB};
use crate::rounds::{check_batch, say};
use crate::run::{self, Modes, Signals};
use crate::sched;
use crate::train::{run_trial, TrialConfig};

/// `gpumux train`: one trial of a job, with loss and accuracy each epoch.
pub fn run(job: &Job, trial: u32, data_dir: Option<&Path>, out: &mut dyn Write) -> Result<()> {
    job.model()?;
    // A signal stops the training at its next step (exit 3); the epochs printed stay printed.
    let session = run::Setup {
        command: "train",
        modes: Modes::Unsplit,
        signals: Signals::Stop,
        opens_device: true,
        data_dir,
    }
    .open(job)?
    .without_folder();
    let (r, data) = (session.resolved()?, session.data()?);
    check_batch(job, data, &[trial])?;
    let device = r.device_for(data)?;
    let spec = plan::trial(job, trial)?;
    let cancel = session.cancel().clone();
    let cfg = TrialConfig {
        model: job.model()?.clone(),
        hyper: spec.hyper.clone(),
        epochs: job.file.train.epochs,
        seed: spec.seed,
        input: data.shape,
        classes: data.classes,
        fault: spec.fault.clone(),
        engine: job.file.engine.clone(),
        max_steps: None,
        warm_up: false,
        cancel,
        prune: None,
    };
    let h = &spec.hyper;
    say(out, format!(
        "trial {}: {} on {}, {} epochs, batch {}, {} lr {}, momentum {}, weight decay {}, dropout {}, seed {}",
        spec.id, job.model()?.kind, data.name, cfg.epochs, h.batch_size, h.optimizer, h.lr, h.momentum, h.weight_decay, h.dropout, spec.seed
    ))?;
    let slice = plan::SliceSpec {
        index: 0,
        device: 0,
        mem_cap_bytes: None,
        sm_count: None,
        partition: None,
    };
    let mut be = sched::open_backend(device.device(0)?, Arc::clone(data), &slice, None)?;
    let net = crate::models::build(
        &cfg.model,
        cfg.input,
        cfg.classes,
        h.batch_size as usize,
        h.dropout as f32,
        h.optimizer,
        &|s| be.conv_workspace_len(s),
    )
    .map_err(|m| Error::Usage(format!("model: {m}")))?;
    say(out, format!("memory plan: {}", net.plan.summary()))?;
    let mut lines = Vec::new();
    let res = run_trial(be.as_mut(), &cfg, &mut |e| {
        let line = format!(
            "epoch {:>3}  train loss {:.4}  train acc {:.4}  test loss {:.4}  test acc {:.4}  {:.2} s",
            e.epoch, e.train_loss, e.train_acc, e.test_loss, e.test_acc, e.wall_s
        );
        let _ = writeln!(out, "{line}");
        lines.push(line);
    });
    match res {
        Ok(r) => say(out, format!(
            "done: test acc {:.4}, final loss {:.4}, {:.2} s, {:.0} samples/s, {} parameters, arena {:.2} MiB",
            r.test_acc, r.final_loss, r.wall_s, r.samples_per_s, r.param_count, r.peak_mem_bytes as f64 / MIB
        )),
        Err(e) => Err(e.into_error(&format!("trial {}", spec.id))),
    }
}
