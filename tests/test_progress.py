"""Progress written to a log file or a pipe is a line every few percent with the ETA; a terminal keeps
tqdm's live bar."""

from __future__ import annotations

import io

from agentgym.progress import LogProgress, progress_bar
from agentgym.tracking import Progress


def test_progress_in_a_log_file_is_a_line_every_few_percent_with_an_eta(capsys):
    log = io.StringIO()
    bar = progress_bar(total=200, desc="held-out", unit="ep", file=log)
    assert isinstance(bar, LogProgress)
    for _ in range(200):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert (
        len(lines) == 20 and lines[0].startswith("held-out:   5% 10/200 ep") and lines[-1].startswith("held-out: 100%")
    )
    assert all("ETA" in line and "elapsed" in line for line in lines)

    progress = Progress(60)  # the trainer's line, to stderr (captured: not a terminal)
    for step in range(60):
        progress.update({"reward/mean": step / 60, "success_rate": 0.5})
    progress.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 20 and err[-1].startswith("train: 100% 60/60 step") and "reward=0.983" in err[-1]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert not isinstance(progress_bar(total=3, file=Terminal()), LogProgress)  # a terminal keeps tqdm's live bar

    log = io.StringIO()
    assert list(progress_bar(range(7), desc="score", unit="row", file=log)) == list(range(7))  # wrapping an iterable
    assert log.getvalue().splitlines()[-1].startswith("score: 100% 7/7 row")
