//! `gpumux train`: one training, from a job file or from flags, with loss and accuracy each epoch.

use std::io::Write;
use std::path::{Path, PathBuf};

use gpumux::data::{DataSpec, Source};
use gpumux::error::Error;
use gpumux::job::{BackendChoice, Job, JobFile, ModelKind, ModelSpec, SplitMode};

use super::flags::{rebuild, EngineFlags, ModelArg, OptArg, SourceArg, StemArg};

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    /// A job file to take the trial from (flags below override it).
    job: Option<PathBuf>,
    /// Which trial of the job's parameter space (0-based).
    #[arg(long, default_value_t = 0)]
    trial: u32,
    #[arg(long, value_enum)]
    model: Option<ModelArg>,
    /// MLP hidden widths, e.g. 256,128,100.
    #[arg(long, value_delimiter = ',')]
    hidden: Option<Vec<usize>>,
    /// ResNet width multiplier, e.g. 0.0625 for a reduced ResNet-50.
    #[arg(long)]
    width: Option<f64>,
    /// ResNet stem: imagenet (7×7/2 conv and max-pool) or cifar (3×3/1 conv).
    #[arg(long, value_enum)]
    stem: Option<StemArg>,
    /// Data source: mnist-10k, fashion-mnist, idx, cifar10 or synthetic.
    #[arg(long, value_enum)]
    data: Option<SourceArg>,
    /// Data folder (for fashion-mnist, idx, cifar10, or a copy of mnist-10k).
    #[arg(long)]
    data_path: Option<PathBuf>,
    /// Folder that relative data paths are taken from.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    epochs: Option<u32>,
    #[arg(long)]
    batch_size: Option<u32>,
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, value_enum)]
    optimizer: Option<OptArg>,
    #[arg(long)]
    momentum: Option<f64>,
    #[arg(long)]
    weight_decay: Option<f64>,
    #[arg(long)]
    dropout: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, value_enum)]
    backend: Option<BackendChoice>,
    #[command(flatten)]
    engine: EngineFlags,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    let (job, trial, data_dir) = job_of(a)?;
    gpumux::runners::train::run(&job, trial, data_dir.as_deref(), out)
}

/// The job flags describe: the job file's (when given) with the flags over it, or one made of
/// the flags alone (an MLP on mnist-10k by default).
fn job_of(a: Args) -> Result<(Job, u32, Option<PathBuf>), Error> {
    let base = match &a.job {
        Some(p) => Some(Job::load(p)?),
        None => None,
    };
    let mut file = match &base {
        Some(j) => j.file.clone(),
        None => JobFile {
            name: Some("train".into()),
            model: Some(ModelSpec::of(ModelKind::Mlp)),
            data: Some(DataSpec::of(Source::Mnist10k)),
            n: vec![1],
            splits: vec![SplitMode::Shared],
            ..JobFile::default()
        },
    };
    if let Some(m) = a.model {
        let kind = ModelKind::from(m);
        if file.model.as_ref().map(|m| m.kind) != Some(kind) {
            file.model = Some(ModelSpec::of(kind));
        }
    }
    if let Some(m) = file.model.as_mut() {
        if let Some(h) = a.hidden {
            m.hidden = Some(h);
        }
        if let Some(w) = a.width {
            m.width = Some(w);
        }
        if let Some(st) = a.stem {
            m.stem = Some(st.into());
        }
    }
    if let Some(d) = a.data {
        file.data = Some(DataSpec::of(d.into()));
    }
    if let Some(p) = a.data_path {
        if let Some(d) = file.data.as_mut() {
            d.path = Some(p);
        }
    }
    // A flag replaces the parameter of the same name: the trial takes the flag's value.
    for (name, given) in [
        ("batch_size", a.batch_size.is_some()),
        ("lr", a.lr.is_some()),
        ("optimizer", a.optimizer.is_some()),
        ("momentum", a.momentum.is_some()),
        ("weight_decay", a.weight_decay.is_some()),
        ("dropout", a.dropout.is_some()),
    ] {
        if given {
            file.parameters.remove(name);
        }
    }
    let t = &mut file.train;
    if let Some(v) = a.epochs {
        t.epochs = v;
    }
    if let Some(v) = a.batch_size {
        t.batch_size = v;
    }
    if let Some(v) = a.lr {
        t.lr = v;
    }
    if let Some(v) = a.optimizer {
        t.optimizer = v.into();
    }
    if let Some(v) = a.momentum {
        t.momentum = v;
    }
    if let Some(v) = a.weight_decay {
        t.weight_decay = v;
    }
    if let Some(v) = a.dropout {
        t.dropout = v;
    }
    if let Some(v) = a.seed {
        file.seed = v;
    }
    if let Some(b) = a.backend {
        file.backend = b;
    }
    a.engine.apply(&mut file);
    let job = match &base {
        Some(j) if file == j.file => j.clone(),
        Some(j) => rebuild(file, j)?,
        None => Job::from_file(file, Path::new("<flags>"))?,
    };
    Ok((job, a.trial, a.data_dir))
}
