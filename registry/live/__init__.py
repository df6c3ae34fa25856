"""What happens while sessions run: one follower thread tails their output and notices their
end (``follower``); one timer thread emits heartbeat and watch events (``notifier``, with the
pure rules of ``heartbeat`` and ``watch``)."""
