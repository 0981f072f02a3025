"""A GAN with two optimizers on a 2-D Gaussian mixture, the way DCGAN-style
examples train: discriminator step on real and detached fake samples, then a
generator step, each with its own Adam; dropout in the discriminator.

Written for the real-code corpus (pytorch/examples' DCGAN needs torchvision,
which has no build for this CPU torch).
"""

import torch
from torch import nn

torch.manual_seed(3)
generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Dropout(0.3), nn.Linear(32, 1))
optimizer_g = torch.optim.Adam(generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizer_d = torch.optim.Adam(discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))
criterion = nn.BCEWithLogitsLoss()
centres = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]])

for step in range(20):
    real = centres[torch.randint(0, 4, (64,))] + 0.1 * torch.randn(64, 2)
    fake = generator(torch.randn(64, 8))
    optimizer_d.zero_grad()
    loss_d = criterion(discriminator(real), torch.ones(64, 1)) + criterion(discriminator(fake.detach()), torch.zeros(64, 1))
    loss_d.backward()
    optimizer_d.step()
    optimizer_g.zero_grad()
    loss_g = criterion(discriminator(fake), torch.ones(64, 1))
    loss_g.backward()
    optimizer_g.step()
    print(f"step {step} loss_d {loss_d.item():.4f} loss_g {loss_g.item():.4f}")
