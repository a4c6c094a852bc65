"""Settings of every learner's Jupyter server on the hub (jupyterhub_config.py puts this folder on JUPYTER_CONFIG_PATH).

Kernels idle for 30 minutes are shut down, which gives their memory back to the class; the hub's idle culler stops
a whole server after an hour without activity. The learner's notebooks are saved in their home either way.
"""

c = get_config()  # noqa: F821  (Jupyter defines get_config while it reads this file)
c.MappingKernelManager.cull_idle_timeout = 30 * 60
c.MappingKernelManager.cull_interval = 5 * 60
c.MappingKernelManager.cull_connected = False  # an open but idle tab does not keep a kernel alive for ever
