"""The offline DFlash eval engine and what it needs: target, drafter, ground truth, walk."""
