"""The data model and the catalogs: frozen specs (Gpu, Link, Model, Cluster, Strategy), the catalog loader, model files, pipeline layouts, conventions and framework runtime constants."""
