"""Studies: sweeps that answer one question with a table, a JSON file and a plot (selection
methods against budgets, dataset compression against accuracy, calibration sets)."""
