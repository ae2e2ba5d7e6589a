"""The web dashboard on the admin port (``/ui``): server-rendered pages over the service layer,
with basic auth, CSRF protection, a read-only mode, an audit log and live sizes (SSE)."""
