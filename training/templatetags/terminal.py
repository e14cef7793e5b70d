from django import template

from training.terminal_log import render_terminal_text

register = template.Library()


@register.filter
def terminal_text(value: str) -> str:
    """A run's raw output as a terminal shows it (see training.terminal_log); autoescaped as usual."""
    return render_terminal_text(value or "")
