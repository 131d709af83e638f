"""The ``npuemu`` command line and report rendering."""
