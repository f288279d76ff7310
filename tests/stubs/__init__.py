"""Stub cluster commands (sbatch, srun, scontrol, gcloud, xpk) for the launch simulations.

Put this directory first on PATH (the commands) and on PYTHONPATH (sitecustomize.py, inert unless
its environment variables are set); simlib.py holds the shared code and documents each stub.
"""
