"""Solution of exercise worker-loop."""


def run_worker(ps, compute_gradients, steps):
    ps.hello({"role": "worker"})
    params, version = {}, None
    for _ in range(steps):
        reply = ps.pull(since=version)
        params.update(reply.params)
        version = reply.version
        if reply.stop:
            break
        grads, samples = compute_gradients(params)
        if ps.push(grads, base=version, samples=samples).stop:
            break
    ps.bye()
