"""Thin Celery tasks: decode the message, call plain functions, return a small summary."""
