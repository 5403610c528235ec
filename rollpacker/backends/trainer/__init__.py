"""What the GRPO trainers share (`loss`, `config`, `policy`: the step logic over three hooks) and the
plain PyTorch trainer (`pytorch.TorchTrainer`, for `--trainer torch`)."""
