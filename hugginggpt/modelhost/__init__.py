"""The local models server: registry, lazy loading under a memory budget, handlers by task family."""
