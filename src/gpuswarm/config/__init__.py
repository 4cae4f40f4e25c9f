"""Config files and command lists -> validated, typed TaskSpecs, with errors naming file, line
and field.

No facade here, deliberately: import each name from the module that defines it (this package
re-exports nothing). A re-exporting ``__init__`` would load pydantic models, the YAML loader and
the task expansion for any caller that needs one constant, and would hide where a name lives;
the one facade for clients of gpuswarm is ``gpuswarm.app.api``. Where things live:

- ``load``       load_config (a YAML file), load_command_list, read_stdin, LoadedConfig,
                 expand_tasks, config_fingerprint, spec_hash
- ``models``     the pydantic models: RunConfig, TaskOptions, TaskEntry, TaskSpec, HomeConfig, ...
- ``backends``   the backend registry: each backend's settings model, options and capabilities
- ``values``     the value types the models use; parse_duration, DURATION_HELP, expand_user
- ``tasks``      tasks: entries -> TaskSpecs (checks, specs); task_id_for; ``taskids``: unique ids
- ``instances``  one entry's instances: matrix combinations, glob matches, {config.*} fields
- ``commands``   command lists (CommandTasks, one template + a row per line), task_dumps
- ``render``     an attempt's argv, env and cwd rendered from its TaskSpec
- ``errors``     pydantic errors -> "file:line: field: problem; fix"
- ``yamlload``   the YAML loader with line numbers and its limits
"""
