"""Local HTTP inference servers that specview starts itself: their lifetime and their shared protocol.

Two modules, one concern each, for every engine that is a separate server
process on 127.0.0.1 (llama.cpp's ``llama-server`` today; ``mlx_lm.server`` or
LM Studio's server are the same shape):

* :mod:`.process` -- :class:`~.process.LocalServer`: start a binary with the
  user's flags, learn its port, wait for ``/health``, keep its log, make JSON
  and streamed (server-sent events) requests that notice a dead server or a
  cancel at once, and stop it.  No server outlives specview: each runs in its
  own process group, is stopped on return, error, cancel and interpreter exit
  (``atexit``, SIGTERM, SIGINT, SIGHUP), and on Linux gets
  ``PR_SET_PDEATHSIG`` so the kernel kills it even when specview is SIGKILLed.
* :mod:`.openai` -- greedy request bodies and response parsing for the
  OpenAI-compatible endpoints these servers share (``/v1/models``,
  ``/v1/completions``, ``/v1/chat/completions``), with what each server
  reports and what it does not.

An engine subclasses :class:`~.process.LocalServer` only to name its program,
recognise the line that announces its port and explain its exit causes; its
own native endpoints (llama-server's ``/completion``) live in the engine's
package.
"""

from .process import Cancelled, LocalServer, ServerError, live_servers, start_all, stop_all

__all__ = ["Cancelled", "LocalServer", "ServerError", "live_servers", "start_all", "stop_all"]
