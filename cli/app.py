"""TEMPORARY: replaced by the CLI owner."""
import typer

app = typer.Typer(help="Profile the memory, time and parity of LM-head losses.")


@app.command()
def grid():
    """Run a grid (placeholder)."""


def main():
    app()
