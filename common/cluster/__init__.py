"""Jobs on a cluster: submitit submission, run status, the workstation's remote loop."""
