"""Hyperparameter sweeps. The routes and service run in the API process; the controller's rounds
(controller.py `sweep_round`) run in the dispatcher, beside its admission rounds, and the API calls
the same controller once when a sweep is created so its first trials queue with it."""
