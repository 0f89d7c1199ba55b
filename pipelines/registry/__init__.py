"""A registered version's life: register, gate and promote, roll back, reproduce, export, serve."""
