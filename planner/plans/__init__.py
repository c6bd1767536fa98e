"""Searching and ranking plans: the search space, the search's array call of the step model, recommend, explanations, what would fit."""
