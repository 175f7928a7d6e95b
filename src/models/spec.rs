//! What a model is: the `model:` section of a job, the optimiser, and the hyperparameters of one trial.

use serde::{Deserialize, Serialize};

/// The network trained by every trial of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Dense layers with ReLU (default 784-128-10).
    Mlp,
    /// conv32-conv64-maxpool-fc128-fc10, as in the Keras MNIST example.
    Cnn,
    /// ResNet-50 v1.5 with batch norm, an `imagenet` or `cifar` stem and a width multiplier.
    Resnet50,
}

impl ModelKind {
    /// Whether the network has convolutions (what cuDNN would be loaded for).
    pub fn has_convolutions(self) -> bool {
        !matches!(self, ModelKind::Mlp)
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Resnet50 => "resnet50",
        })
    }
}

/// Convolution padding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Padding {
    #[default]
    Valid,
    Same,
}

/// The `model:` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub kind: ModelKind,
    /// MLP hidden widths (default `[128]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<usize>>,
    /// CNN convolution channels (default `[32, 64]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<usize>>,
    /// CNN kernel size, 3 or 5 (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<usize>,
    /// CNN padding (default valid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding: Option<Padding>,
    /// CNN width of the dense layer after pooling (default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fc: Option<usize>,
    /// ResNet width multiplier on every layer's channels (default 1; e.g. 0.0625 for tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<f64>,
    /// ResNet stem (default `imagenet` for inputs of 64×64 or more, else `cifar`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stem: Option<Stem>,
}

/// The first layers of a ResNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stem {
    /// 7×7/2 conv, batch norm, ReLU, 3×3/2 max-pool: for 224×224 images.
    Imagenet,
    /// 3×3/1 conv, batch norm, ReLU: for 32×32 images.
    Cifar,
}

impl std::fmt::Display for Stem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stem::Imagenet => "imagenet",
            Stem::Cifar => "cifar",
        })
    }
}

impl ModelSpec {
    pub fn of(kind: ModelKind) -> Self {
        ModelSpec {
            kind,
            hidden: None,
            channels: None,
            kernel: None,
            padding: None,
            fc: None,
            width: None,
            stem: None,
        }
    }
    pub fn hidden(&self) -> Vec<usize> {
        self.hidden.clone().unwrap_or_else(|| vec![128])
    }
    pub fn channels(&self) -> Vec<usize> {
        self.channels.clone().unwrap_or_else(|| vec![32, 64])
    }
    pub fn kernel(&self) -> usize {
        self.kernel.unwrap_or(3)
    }
    pub fn padding(&self) -> Padding {
        self.padding.unwrap_or_default()
    }
    pub fn fc(&self) -> usize {
        self.fc.unwrap_or(128)
    }
    pub fn width(&self) -> f64 {
        self.width.unwrap_or(1.0)
    }
    /// The stem for inputs of `h × w`: as set, else `imagenet` from 64×64 up and `cifar` below.
    pub fn stem(&self, h: usize, w: usize) -> Stem {
        self.stem.unwrap_or(if h.min(w) >= 64 {
            Stem::Imagenet
        } else {
            Stem::Cifar
        })
    }
}

/// The optimiser of a trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    Sgd,
    Adam,
}

impl std::fmt::Display for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adam => "adam",
        })
    }
}

/// The hyperparameters of one trial.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hyper {
    pub lr: f64,
    pub batch_size: u32,
    pub optimizer: Optimizer,
    pub momentum: f64,
    pub weight_decay: f64,
    pub dropout: f64,
}
