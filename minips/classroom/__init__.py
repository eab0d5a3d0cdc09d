"""The classroom: the browser gateway, the dashboard, the exercises."""
