"""Run by every kernel that the site's build starts (PYTHONSTARTUP, set by site/conf.py): the widgets' static forms.

JupyterLab never runs this file; see amp_lessons/tools/site_forms.py.
"""

from amp_lessons.tools.site_forms import install

install()
del install
