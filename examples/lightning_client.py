"""A LightningModule as any Lightning user writes it, federated by class path as the clients' network
(``model.class_path``): its ``training_step`` trains on the client's own data, fdlit distils its
``forward`` logits against the teacher, its ``configure_optimizers`` (Adam and a StepLR) is used and
its ``self.log`` values reach the run's metrics as ``clients/log/<name>``."""

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn


class LitClassifier(pl.LightningModule):
    def __init__(self, input_shape=(1, 8, 8), num_classes=10, hidden=64, lr=1e-3, step_size=5, gamma=0.5):
        super().__init__()
        self.save_hyperparameters()
        size = 1
        for d in input_shape:
            size *= d
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(size, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss)
        self.log("train_acc", (logits.argmax(-1) == y).float().mean())
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=self.hparams.step_size,
                                                    gamma=self.hparams.gamma)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}
