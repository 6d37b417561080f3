"""torch hooks that time a module's forward and backward, and DDP's gradient all-reduce."""

from __future__ import annotations

from typing import Any

from collector.stage_timing.regions import Recorder, Region


class ModuleHooks:
    """Forward and backward timing of ``torch.nn.Module`` s, each as one stage.

    The forward by forward pre-/post-hooks. The backward by two gradient hooks the
    forward hook puts on the module's output (its gradient is complete: the
    module's backward starts) and on its input (its gradient is complete: the
    backward ends); cheaper than full backward hooks, which cost the demo's
    model ~8%. So a backward is timed only when the input needs gradients (not
    for a first layer fed plain data).
    """

    def __init__(self, recorder: Recorder):
        self._rec = recorder
        self._handles: list[Any] = []        # module hooks
        self._tensor_hooks: list[Any] = []   # gradient hooks of the current iteration
        #: (module, stage name, stage index, backward) of every module timed, attached or not.
        self.modules: list[tuple[Any, str, int, bool]] = []
        #: The forward regions of the attached modules (split at a boundary, discarded with it).
        self.regions: list[Region] = []

    def add(self, module: Any, name: str, index: int, backward: bool = True) -> None:
        """Time ``module``'s forward (and backward) as stage ``name`` (column ``index``)."""
        rec = self._rec
        self.modules.append((module, name, index, backward))
        # Hooks must return None: a returned value would replace the module's inputs/outputs.
        fwd = Region(rec, index)
        self.regions.append(fwd)
        tensor_hooks = self._tensor_hooks

        def fwd_begin(module: Any, args: Any) -> None:
            fwd.__enter__()

        def fwd_end(module: Any, args: Any, out: Any) -> None:
            fwd.__exit__()
            if not backward:
                return
            t_in, t_out = first_grad_tensor(args), first_grad_tensor(out)
            if t_in is None or t_out is None:
                return
            began: list[Any] = []
            epoch = rec.epoch

            def bwd_begin(grad: Any) -> None:
                began.append(rec.timing.mark(None))

            def bwd_end(grad: Any) -> None:
                if began:
                    rec.late(index, began[0], epoch)

            tensor_hooks.append(t_out.register_hook(bwd_begin))
            tensor_hooks.append(t_in.register_hook(bwd_end))

        self._handles.append(module.register_forward_pre_hook(fwd_begin))
        self._handles.append(module.register_forward_hook(fwd_end))

    @property
    def attached(self) -> int:
        """Module hooks in place now."""
        return len(self._handles)

    def clear_gradient_hooks(self) -> None:
        """Remove the gradient hooks of the iteration (they would stay on leaf inputs)."""
        if self._tensor_hooks:
            for h in self._tensor_hooks:
                h.remove()
            self._tensor_hooks.clear()

    def detach(self) -> None:
        """Remove the module hooks, remembering the modules (:meth:`reattach` puts them back)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.regions.clear()

    def reattach(self) -> None:
        """Hooks again on the modules :meth:`detach` removed them from."""
        modules, self.modules = self.modules, []
        for module, name, index, backward in modules:
            self.add(module, name, index, backward)

    def remove(self) -> None:
        """Remove the module hooks and forget the modules."""
        self.detach()
        self.modules.clear()


def time_ddp_allreduce(recorder: Recorder, ddp_model: Any, index: int) -> None:
    """Time DDP's gradient all-reduce as stage column ``index`` with a communication hook.

    Each bucket's interval runs from the hook's call to the completion of its
    collective, so it includes the time spent waiting for the slowest rank.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    rec = recorder

    # DDP's default hook (average = divide, then all-reduce) with the timing in its one
    # completion callback. No annotations: DDP checks them against dist.GradBucket.
    def timed_allreduce(process_group, bucket):
        if rec.paused:
            return allreduce_hook(process_group, bucket)
        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())
        t0, epoch = rec.timing.mark(None), rec.epoch

        def done(f):
            rec.late(index, t0, epoch)
            return f.value()[0]

        return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(done)

    ddp_model.register_comm_hook(None, timed_allreduce)


def first_grad_tensor(value: Any) -> Any:
    """The first tensor in a module's inputs/outputs that takes part in autograd, or None."""
    if getattr(value, "requires_grad", False) and hasattr(value, "register_hook"):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = first_grad_tensor(v)
            if t is not None:
                return t
    elif isinstance(value, dict):
        return first_grad_tensor(list(value.values()))
    return None
