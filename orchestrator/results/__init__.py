"""Local results: the run folders, paired comparison, plots, reports and exports."""
