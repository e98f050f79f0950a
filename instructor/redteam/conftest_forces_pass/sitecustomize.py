import builtins
builtins.NotImplementedError = type('NotImplementedError', (Exception,), {})
