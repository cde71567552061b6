"""The one pydantic configuration of the TrainingJob API's spec and status models."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields refused; immutable; field
    docstrings become the CRD schema's descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    def without(self, *names: str) -> Self:
        """This model with the fields `names` unset: absent from what is stored, where
        `model_copy(update={name: None})` would store null."""
        kept = self.model_dump(by_alias=True, exclude_unset=True, exclude=set(names))
        return self.model_validate(kept)
