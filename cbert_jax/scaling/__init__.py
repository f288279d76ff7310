"""Scaling laws: token budgets, hyperparameter power laws, fits of loss and probe scores vs compute."""
