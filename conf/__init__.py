# Hydra config groups, shipped inside the package as runner.conf (see setup.cfg).
