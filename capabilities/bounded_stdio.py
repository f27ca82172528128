"""The MCP SDK's stdio client transport with a bounded reader of the server's stdout.

The SDK's `stdio_client` gathers a line of stdout however long it grows, so a server that writes a
gigabyte without a newline makes Writ hold a gigabyte. This is the same transport, spawning and
stopping the server with the SDK's own functions (and so as the MCP spec says: close stdin, wait,
then end the process group), except that stdout is cut into messages by `stdio_framing`, which holds
no line past `max_message_bytes`. A stream the reader gives up on (a flood), or one the server
closes, ends the transport: `ended` is called so the session is opened afresh for the next call.

The server's stderr is not read: as in the SDK it is handed to the child as `errlog` (Writ's own
stderr), so no pipe of it can fill up and stop the server, and none of it passes through Writ's
memory.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TextIO

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters
from mcp.client.stdio import (
    # Private, and kept: spawning in a kill scope of its own (a process group, a Windows Job Object)
    # and stopping it as the MCP spec says are a pair; a copy would fork the SDK's kill policy.
    _create_platform_compatible_process,
    _get_executable_command,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

from capabilities.stdio_framing import MessageReader

logger = logging.getLogger(__name__)

WRITER_FLUSH_S = 0.5
"""How long shutdown lets the writer flush what it holds before the server is stopped (the SDK's)."""

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
"""What the transport yields: the read and write streams an `mcp.Client` talks over."""


@asynccontextmanager
async def bounded_stdio_client(
    server: StdioServerParameters,
    max_message_bytes: int,
    ended: Callable[[], None],
    errlog: TextIO = sys.stderr,
) -> AsyncGenerator[Streams, None]:
    """Spawn the server and talk to it over stdin/stdout, reading no message past the limit.

    Raises:
        OSError: the server process cannot be spawned.
        ValueError: the spawn parameters are invalid (embedded NUL bytes).
    """
    command = await _get_executable_command(server.command)
    try:
        process = await _create_platform_compatible_process(
            command=command,
            args=server.args,
            env=get_default_environment() | (server.env or {}),
            errlog=errlog,
            cwd=server.cwd,
        )
    except OSError as exc:
        # The OS says "No such file or directory" for a missing command and a missing cwd alike,
        # and names neither.
        raise type(exc)(exc.errno, _spawn_problem(command, server.cwd, exc)) from exc
    # As in the SDK: no awaits from the spawn until the task group is entered, or a cancellation in
    # between would leak the live process.
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    shutting_down = False
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout is not None
        reader = MessageReader(max_message_bytes, server.encoding, server.encoding_error_handler)
        try:
            async with read_stream_writer:
                async for chunk in process.stdout:
                    for item in reader.feed(chunk):
                        try:
                            await read_stream_writer.send(item)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            return  # the session is gone; only the drain below remains
                    if reader.gave_up:
                        return
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed the stdout stream under the read
        except (anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:
                logger.exception("Reading from the MCP server's stdout failed mid-session")
        finally:
            # Nothing is awaited between handing the last message over and this, so the call it
            # answers cannot go on to send another to this session before it is given up.
            if not shutting_down:
                ended()  # the server closed its stdout, or its stream was given up
            # Read on and drop the rest, so a server blocked writing can take its stdin's close and
            # exit when the transport shuts down (the SDK's drain; it ends when stdout closes).
            assert process.stdout is not None
            await _drain(process.stdout)

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    json = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    data = (json + "\n").encode(server.encoding, server.encoding_error_handler)
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still be alive: end the read side so no request waits forever.
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        """Stop traffic, let the writer flush, stop the server, release the streams (as the SDK)."""
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(WRITER_FLUSH_S):
            await writer_done.wait()
        await _stop_server_process(process)
        for stream in (read_stream, write_stream, read_stream_writer, write_stream_reader):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):  # every wait inside is bounded
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()


def _spawn_problem(command: str, cwd: str | Path | None, exc: OSError) -> str:
    if cwd is not None and not Path(cwd).is_dir():
        return f"cwd {str(cwd)!r} is not a directory"
    return f"command {command!r} cannot be started ({exc.strerror or exc})"


async def _drain(stdout: ByteReceiveStream) -> None:
    """Read and drop the rest of stdout until it closes (shielded: shutdown closes it)."""
    with anyio.CancelScope(shield=True):
        try:
            while True:
                await stdout.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            return
