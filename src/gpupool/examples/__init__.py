"""Example jobs that speak the job protocol."""
