"""An OpenAI-compatible gateway driven by lbbench's dispatcher and routers (``lbbench proxy``)."""
