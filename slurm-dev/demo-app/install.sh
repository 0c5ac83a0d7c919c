#!/bin/sh
# The demo job's dependency install, run by `bootseer deps run` on every node: a venv
# with pip and setuptools, and a C extension compiled into it. Like a real job's
# `pip install` of wheels and an sdist, in seconds and without a network.
set -eu
prefix=$BOOTSEER_DEPS_PREFIX
/usr/bin/python3 -m venv "$prefix"
site=$("$prefix/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
include=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
cc -O2 -shared -fPIC -I"$include" "$(dirname "$0")/demo_ext.c" -o "$site/demo_ext$suffix"
