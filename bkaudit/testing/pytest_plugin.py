"""pytest fixtures for the embedded services. Status: being written (foundation issue)."""
