# Hydra config groups, shipped inside the package as runner.conf (see setup.cfg). Loading them
# needs the schemas they extend (schema/...) in Hydra's ConfigStore: importing this package
# registers them.
from runner.commands.compose import register_schemas

register_schemas()
