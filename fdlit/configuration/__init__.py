"""What a run is told: the ``fit`` config schema and everything it reads and checks on the way.

Its modules sit in different layers (docs/design.md), lowest first: ``bounded_yaml`` (YAML within
caps), ``files`` (strict YAML config files), ``ranges`` and ``run_settings`` (the ``logger`` and
``checkpoint`` sections), ``constructible`` and ``code_allowlist`` (the classes a config may name),
and ``schema``, the ``fit`` schema over every section. This file imports none of them, so a low
layer (``fdlit.data`` reading bounded YAML) never pulls in the schema.
"""
